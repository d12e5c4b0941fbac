// Broadcast from `root`, binomial tree over ranks relative to the root:
//
//   round k = 0, 1, ...: every relative rank v < 2^k that holds the data sends
//   it to v + 2^k (if that rank exists).
//
// Rounds: ceil(log2 N). Bytes sent: P by each rank that forwards, at most
// ceil(log2 N) P by the root; every non-root receives P exactly once.
// Barrier: an all-reduce of one float (Auto), whose completion needs every rank.
#include "algorithms.h"
#include "fingerprint.h"
#include "lockstep/error.h"

namespace lockstep::comm {

void broadcast(Communicator& comm, std::span<std::byte> data, int root) {
  const int n = comm.size();
  if (root < 0 || root >= n) {
    refuse_call(
        comm, "broadcast root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(n));
  }
  const detail::CollectiveScope scope(comm, "broadcast");
  const Fingerprint fp = detail::start_collective(comm, CollectiveKind::Broadcast, ReduceOp::Sum,
                                                  DataType::Bytes, data.size(), root);
  detail::run_collective(comm, fp, [&] {
    comm.check_fingerprint(fp);
    const std::uint64_t seq = fp.sequence;
    const int v = (comm.rank() - root + n) % n;  // relative rank
    std::uint32_t round = 0;
    for (int step = 1; step < n; step <<= 1, ++round) {
      if (v < step) {
        if (v + step < n) detail::send_tagged(comm, (v + step + root) % n, detail::make_tag(seq, round), data);
      } else if (v < 2 * step) {
        detail::recv_tagged(comm, (v - step + root) % n, detail::make_tag(seq, round), data);
      }
    }
  });
}

void barrier(Communicator& comm) {
  float token = 0.0f;
  detail::allreduce_as(comm, std::span<float>(&token, 1), {.op = ReduceOp::Sum}, CollectiveKind::Barrier);
}

}  // namespace lockstep::comm
