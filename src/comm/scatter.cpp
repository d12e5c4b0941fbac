// Scatter from `root`: block i of the root's `in` (N blocks of P elements)
// lands in rank i's `out` (P elements, the same P on every rank).
//
//   the root sends block i to rank i, in one message each, with round = i,
//   all N-1 sends posted at once; every other rank receives its block.
//
// Rounds: 1. Bytes sent: (N-1) P by the root, none by the others, each of
// which receives P. The others' `in` is not used (it may be empty). The
// mirror of gather.cpp: for state each rank needs its own part of (a
// checkpoint's per-replica state on --resume), where a broadcast would send
// every rank all N parts.
#include <memory>
#include <vector>

#include "algorithms.h"
#include "fingerprint.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"

namespace lockstep::comm {

void scatter(Communicator& comm, std::span<const float> in, std::span<float> out, int root) {
  const int n = comm.size(), r = comm.rank();
  if (root < 0 || root >= n) {
    refuse_call(comm, "scatter root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(n));
  }
  const std::size_t block = out.size();
  if (r == root && in.size() != block * static_cast<std::size_t>(n)) {
    refuse_call(comm, "scatter: the root's input must hold " + std::to_string(n) + " x " + std::to_string(block) +
                          " elements, got " + std::to_string(in.size()));
  }
  const detail::CollectiveScope scope(comm, "scatter");
  const Fingerprint fp =
      detail::start_collective(comm, CollectiveKind::Scatter, ReduceOp::Sum, DataType::Float32, block, root);
  detail::run_collective(comm, fp, [&] {
    comm.check_fingerprint(fp);
    if (r != root) {
      detail::recv_tagged(comm, root, detail::make_tag(fp.sequence, static_cast<std::uint32_t>(r)),
                          std::as_writable_bytes(out));
      return;
    }
    std::vector<std::unique_ptr<Work>> sends;
    for (int i = 0; i < n; ++i) {
      if (i == root) continue;
      sends.push_back(comm.post_send(i, detail::make_tag(fp.sequence, static_cast<std::uint32_t>(i)),
                                     std::as_bytes(in.subspan(block * static_cast<std::size_t>(i), block))));
    }
    const auto mine = in.subspan(block * static_cast<std::size_t>(root), block);
    std::copy(mine.begin(), mine.end(), out.begin());
    for (auto& w : sends) w->wait(comm.timeout());
  });
}

}  // namespace lockstep::comm
