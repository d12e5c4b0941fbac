// Recursive halving-doubling all-reduce (Rabenseifner), for any N.
//
// Let p be the largest power of two <= N and e = N - p.
//   0. Fold: for r < 2e, odd r sends its whole buffer to r-1, which reduces
//      it; the odd ranks then wait for step 3. The p remaining ranks are
//      renumbered v = 0..p-1.
//   1. Reduce-scatter by recursive halving, distance d = p/2, p/4, ..., 1:
//      exchange with v XOR d the half of the current segment the partner
//      keeps, and reduce the half we keep. After log2 p rounds, v holds the
//      full reduction of segment v (1/p of the buffer); Mean scales it here.
//   2. All-gather by recursive doubling, d = 1, 2, ..., p/2: exchange
//      segments with v XOR d; the owned segment doubles each round.
//   3. Unfold: r-1 sends the whole result back to odd r < 2e.
//
// Rounds: 2 log2 p (+2 when N is not a power of two).
// Bytes sent per rank of the p: 2P(p-1)/p; the fold adds P for the ranks in it.
// Every rank ends with the same bytes: each segment is reduced once, by its
// owner, and then copied.
// Steps 1 and 2 are halving_doubling_rounds (recursive_halving.cpp), with
// the distances in this order.
#include <vector>

#include "algorithms.h"
#include "recursive_halving.h"

namespace lockstep::comm::detail {

void halving_doubling_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t seq) {
  const int n = comm.size();
  const int r = comm.rank();
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  const std::uint64_t fold_tag = make_tag(seq, 0);
  const std::uint64_t unfold_tag = make_tag(seq, 0xfffe);

  auto scratch_bytes = comm.scratch(data.size_bytes());
  auto* tmp = reinterpret_cast<float*>(scratch_bytes.data());

  // 0. Fold the extra ranks into their even neighbours.
  if (r < 2 * extra) {
    if (r % 2 == 1) {
      send_tagged(comm, r - 1, fold_tag, std::as_bytes(data));
      recv_tagged(comm, r - 1, unfold_tag, std::as_writable_bytes(data));  // 3.
      return;
    }
    recv_tagged(comm, r + 1, fold_tag, std::as_writable_bytes(std::span<float>(tmp, data.size())));
    reduce_into(data, std::span<const float>(tmp, data.size()), op);
  }
  const int v = r < 2 * extra ? r / 2 : r - extra;
  auto real_rank = [&](int vv) { return vv < extra ? vv * 2 : vv + extra; };

  // 1. and 2., from round 1 (round 0 is the fold).
  std::vector<int> distances;  // farthest partner first
  for (int d = p / 2; d >= 1; d /= 2) distances.push_back(d);
  halving_doubling_rounds(comm, data, op, seq, 1, v, distances, real_rank);

  // 3. Unfold.
  if (r < 2 * extra) send_tagged(comm, r + 1, unfold_tag, std::as_bytes(data));
}

}  // namespace lockstep::comm::detail
