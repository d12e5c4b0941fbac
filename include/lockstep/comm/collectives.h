// Collective operations, written once over the Communicator interface.
//
// Every rank of the group must make the same sequence of collective calls with
// the same counts, ops and roots. All ranks end an all-reduce with bitwise
// identical results.
#pragma once

#include <span>

#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

enum class Algorithm {
  Auto,   // chosen by size and world size (see docs/algorithms.md)
  Ring,   // reduce-scatter + all-gather; ~2P(N-1)/N bytes sent per rank
  HalvingDoubling,  // recursive halving + doubling, any N; 2 log2 N rounds
  Naive,  // gather to rank 0, reduce, broadcast; the reference
  SharedMemory,  // the backend's native shared-memory path (threads backend only)
};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::Sum;
  Algorithm algorithm = Algorithm::Auto;
};

const char* to_string(ReduceOp op);
const char* to_string(Algorithm algorithm);

// In place: on return every rank's `data` holds op(data of all ranks).
void allreduce(Communicator& comm, std::span<float> data, const AllreduceOptions& options = {});

// In place: on return every rank's `data` holds root's `data`.
void broadcast(Communicator& comm, std::span<std::byte> data, int root);
inline void broadcast(Communicator& comm, std::span<float> data, int root) {
  broadcast(comm, std::as_writable_bytes(data), root);
}

// Returns once every rank has entered the barrier.
void barrier(Communicator& comm);

}  // namespace lockstep::comm
