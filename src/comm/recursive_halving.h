// Private: the rounds of recursive halving and doubling that the
// halving-doubling and tree all-reduces share; they differ in the order of
// the distances (halving_doubling_allreduce.cpp, tree_allreduce.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "lockstep/comm/collectives.h"

namespace lockstep::comm::detail {

// Among p = 2^distances.size() ranks, numbered v = 0..p-1 (this rank is v;
// real_rank(u) is the communicator's rank of u):
//   1. Reduce-scatter by recursive halving, for d in `distances` in order:
//      exchange with v XOR d the half of the current segment the partner
//      keeps, and reduce the half we keep (the lower half when v & d is 0).
//      Segments are cut in halves by element count; the path of halvings a
//      rank takes is fixed by its bits, so both partners agree on every
//      boundary. Then finish() (Mean's scaling) on the segment we end with.
//   2. All-gather by recursive doubling, for d in `distances` backwards:
//      retrace the halvings, exchanging owned segments; the owned segment
//      doubles each round.
// Rounds: 2 distances.size(), tagged make_tag(seq, first_round), +1, ...
// Bytes sent per rank: 2P(p-1)/p. Uses comm.scratch().
void halving_doubling_rounds(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t seq,
                             std::uint32_t first_round, int v, std::span<const int> distances,
                             const std::function<int(int)>& real_rank);

}  // namespace lockstep::comm::detail
