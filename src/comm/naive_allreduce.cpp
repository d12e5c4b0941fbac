// Naive all-reduce, the reference the other algorithms are tested against:
//
//   1. every rank r != 0 sends its whole buffer to rank 0;
//   2. rank 0 reduces the buffers in rank order 1..N-1 into its own;
//   3. rank 0 sends the result to every other rank.
//
// Rounds: 2 (but rank 0 handles 2(N-1) messages in sequence).
// Bytes sent: P per rank r != 0; (N-1)P by rank 0.
#include "algorithms.h"

namespace lockstep::comm::detail {

void naive_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t seq) {
  const int n = comm.size();
  if (comm.rank() != 0) {
    send_tagged(comm, 0, make_tag(seq, 0), std::as_bytes(data));
    recv_tagged(comm, 0, make_tag(seq, 1), std::as_writable_bytes(data));
    return;
  }
  auto scratch_bytes = comm.scratch(data.size_bytes());
  std::span<float> tmp(reinterpret_cast<float*>(scratch_bytes.data()), data.size());
  for (int peer = 1; peer < n; ++peer) {
    recv_tagged(comm, peer, make_tag(seq, 0), std::as_writable_bytes(tmp));
    reduce_into(data, tmp, op);
  }
  finish(data, op, n);
  for (int peer = 1; peer < n; ++peer) {
    send_tagged(comm, peer, make_tag(seq, 1), std::as_bytes(data));
  }
}

}  // namespace lockstep::comm::detail
