// Private: the peer of a point-to-point call, checked alike by every backend.
#pragma once

#include <string>

#include "lockstep/error.h"

namespace lockstep::comm::detail {

// InvalidArgument unless `peer` is another rank of a group of `size`;
// `what` is "send to" or "recv from".
inline void check_peer(int rank, int size, int peer, const char* what) {
  if (peer == rank) throw InvalidArgument("rank " + std::to_string(rank) + ": cannot " + what + " itself");
  if (peer < 0 || peer >= size) {
    throw InvalidArgument("rank " + std::to_string(rank) + ": cannot " + what + " rank " + std::to_string(peer) +
                          " in a group of " + std::to_string(size));
  }
}

}  // namespace lockstep::comm::detail
