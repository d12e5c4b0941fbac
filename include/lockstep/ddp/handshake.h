// The start-up handshake: replicas refuse to start unless they agree.
//
// Before step 0 every replica describes what it is about to run as named
// fields (the configuration, the data plan, the model's tensors, the bucket
// layout, the build), and the replicas compare a digest of each field. A
// replica started with another seed, learning rate, width or build would
// otherwise train happily and silently diverge; here every rank refuses, with
// the same message, naming the field and the rank.
#pragma once

#include <span>
#include <string>

#include "lockstep/comm/communicator.h"

namespace lockstep::ddp {

struct HandshakeField {
  std::string name;   // what the user can change, e.g. "--lr" or "bucket layout"
  std::string value;  // a canonical text of the value on this rank
};

// Collective: compares the fields across ranks. First the list of field
// names (so that two builds with different fields fail cleanly), then each
// field's value. Throws InvalidArgument on every rank if any rank differs,
// naming each differing field and the ranks that hold another value than the
// majority. Blocks at most the communicator's timeout per collective (two).
void handshake(comm::Communicator& comm, std::span<const HandshakeField> fields);

}  // namespace lockstep::ddp
