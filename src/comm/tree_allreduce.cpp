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
#include <vector>

#include "algorithms.h"
#include "lockstep/error.h"

namespace lockstep::comm::detail {
namespace {

struct Segment {
  std::size_t begin, end;
};

}  // namespace

void tree_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t seq) {
  const int n = comm.size();
  const int v = comm.rank();
  if ((n & (n - 1)) != 0) {
    throw InvalidArgument("the tree all-reduce needs a power-of-two number of ranks, not " + std::to_string(n));
  }
  std::uint32_t round = 0;
  auto scratch_bytes = comm.scratch(data.size_bytes());
  auto* tmp = reinterpret_cast<float*>(scratch_bytes.data());

  std::vector<Segment> path;  // segment held before each halving round
  Segment seg{0, data.size()};
  for (int d = 1; d < n; d *= 2, ++round) {  // 1. nearest partner first
    const int partner = v ^ d;
    const std::size_t mid = seg.begin + (seg.end - seg.begin) / 2;
    const bool keep_low = (v & d) == 0;
    const Segment keep = keep_low ? Segment{seg.begin, mid} : Segment{mid, seg.end};
    const Segment give = keep_low ? Segment{mid, seg.end} : Segment{seg.begin, mid};
    const std::uint64_t tag = make_tag(seq, round);
    auto rw = comm.irecv(partner, tag, std::as_writable_bytes(std::span<float>(tmp, keep.end - keep.begin)));
    auto sw = comm.isend(partner, tag, std::as_bytes(data.subspan(give.begin, give.end - give.begin)));
    rw->wait(comm.timeout());
    reduce_into(data.subspan(keep.begin, keep.end - keep.begin),
                std::span<const float>(tmp, keep.end - keep.begin), op);
    sw->wait(comm.timeout());
    path.push_back(seg);
    seg = keep;
  }
  finish(data.subspan(seg.begin, seg.end - seg.begin), op, n);

  for (int d = n / 2; d >= 1; d /= 2, ++round) {  // 2. retrace
    const int partner = v ^ d;
    const Segment whole = path.back();
    path.pop_back();
    const Segment theirs =
        seg.begin == whole.begin ? Segment{seg.end, whole.end} : Segment{whole.begin, seg.begin};
    const std::uint64_t tag = make_tag(seq, round);
    auto rw =
        comm.irecv(partner, tag, std::as_writable_bytes(data.subspan(theirs.begin, theirs.end - theirs.begin)));
    auto sw = comm.isend(partner, tag, std::as_bytes(data.subspan(seg.begin, seg.end - seg.begin)));
    rw->wait(comm.timeout());
    sw->wait(comm.timeout());
    seg = whole;
  }
}

}  // namespace lockstep::comm::detail
