// The threads backend: N ranks as threads of one process.
//
// Transfers are rendezvous copies: a send and its matching receive meet in a
// shared mailbox and the payload is copied once, straight from the sender's
// buffer into the receiver's. No bytes go through a socket, but every byte a
// collective moves is still counted, exactly as a network backend would.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

struct ThreadGroupOptions {
  int world_size = 1;
  Duration timeout{std::chrono::seconds(60)};  // default for blocking calls
  // 0: the ranks say nothing of nodes (Communicator::nodes() is empty).
  // G > 0: ranks r and s are on one node when r / G == s / G, to try the
  // hierarchical all-reduce, or to model nodes over a modelled link.
  int ranks_per_node = 0;
};

// Creates `world_size` connected communicators, one per rank, to be handed to
// one thread each. They share the group's mailbox; the group lives as long as
// any of them.
std::vector<std::unique_ptr<Communicator>> make_thread_group(const ThreadGroupOptions& options);

}  // namespace lockstep::comm
