// Tree all-reduce: recursive halving from the nearest partner out, then
// recursive doubling back. Powers of two only.
//
// Note [Tree order]: every element's sum is taken in one balanced binary
// tree over rank index, (((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))),
// the same tree a single rank takes over the same inputs in order. That is
// what makes training bit-exact for any replica count (--deterministic): a
// replica tree-sums its own atoms, and the ranks' partial sums are then
// subtrees of the one tree over all atoms. Halving-doubling pairs the most
// distant ranks first (v XOR p/2), which is another tree; the ring adds in
// an order that depends on N.
//
//   1. Reduce-scatter by recursive halving, distance d = 1, 2, ..., N/2:
//      exchange with v XOR d the half of the current segment the partner
//      keeps, and add the half we keep. After round k every kept element is
//      the sum over an aligned group of 2^(k+1) adjacent ranks, and IEEE
//      addition is commutative, so both partners' sums have the same bits.
//   2. All-gather by recursive doubling, d = N/2, ..., 1: retrace the
//      halvings backwards, exchanging owned segments.
//
// Rounds: 2 log2 N. Bytes sent per rank: 2P(N-1)/N, as the ring.
// Steps 1 and 2 are halving_doubling_rounds (recursive_halving.cpp), with
// the distances in this order.
#include <vector>

#include "algorithms.h"
#include "lockstep/error.h"
#include "recursive_halving.h"

namespace lockstep::comm::detail {

void tree_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t seq) {
  const int n = comm.size();
  if ((n & (n - 1)) != 0) {
    throw InvalidArgument("the tree all-reduce needs a power-of-two number of ranks, not " + std::to_string(n));
  }
  std::vector<int> distances;  // 1. nearest partner first; 2. retraces them
  for (int d = 1; d < n; d *= 2) distances.push_back(d);
  halving_doubling_rounds(comm, data, op, seq, 0, comm.rank(), distances, [](int v) { return v; });
}

}  // namespace lockstep::comm::detail
