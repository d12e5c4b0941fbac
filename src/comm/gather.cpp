// Gather to `root`: rank i's `in` (P elements, the same P on every rank)
// lands at i x P of the root's `out`.
//
//   every rank but the root sends its P to the root, in one message, with
//   round = its rank; the root posts all N-1 receives at once, then waits.
//
// Rounds: 1. Bytes sent: P by each non-root rank, none by the root, which
// receives (N-1) P. The other ranks' `out` is not touched (it may be empty).
// For what only one rank needs (a checkpoint of state the replicas hold
// differently): all_gather would send (N-1) P from every rank and leave
// N x P on each.
#include <memory>
#include <vector>

#include "algorithms.h"
#include "fingerprint.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"

namespace lockstep::comm {

void gather(Communicator& comm, std::span<const float> in, std::span<float> out, int root) {
  const int n = comm.size(), r = comm.rank();
  if (root < 0 || root >= n) {
    refuse_call(comm, "gather root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(n));
  }
  const std::size_t block = in.size();
  if (r == root && out.size() != block * static_cast<std::size_t>(n)) {
    refuse_call(comm, "gather: the root's output must hold " + std::to_string(n) + " x " + std::to_string(block) +
                          " elements, got " + std::to_string(out.size()));
  }
  const detail::CollectiveScope scope(comm, "gather");
  const Fingerprint fp =
      detail::start_collective(comm, CollectiveKind::Gather, ReduceOp::Sum, DataType::Float32, block, root);
  detail::run_collective(comm, fp, [&] {
    comm.check_fingerprint(fp);
    if (r != root) {
      detail::send_tagged(comm, root, detail::make_tag(fp.sequence, static_cast<std::uint32_t>(r)), std::as_bytes(in));
      return;
    }
    std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(block) * r);
    std::vector<std::unique_ptr<Work>> receives;
    for (int i = 0; i < n; ++i) {
      if (i == root) continue;
      receives.push_back(comm.post_recv(i, detail::make_tag(fp.sequence, static_cast<std::uint32_t>(i)),
                                        std::as_writable_bytes(out.subspan(block * static_cast<std::size_t>(i), block))));
    }
    for (auto& w : receives) w->wait(comm.timeout());
  });
}

}  // namespace lockstep::comm
