// The rounds of recursive halving and doubling (recursive_halving.h).
#include "recursive_halving.h"

#include <vector>

#include "algorithms.h"

namespace lockstep::comm::detail {
namespace {

struct Segment {
  std::size_t begin, end;
};

}  // namespace

void halving_doubling_rounds(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t seq,
                             std::uint32_t first_round, int v, std::span<const int> distances,
                             const std::function<int(int)>& real_rank) {
  std::uint32_t round = first_round;
  auto scratch_bytes = comm.scratch(data.size_bytes());
  auto* tmp = reinterpret_cast<float*>(scratch_bytes.data());

  // 1. Recursive halving.
  std::vector<Segment> path;  // segment held before each halving round
  Segment seg{0, data.size()};
  for (int d : distances) {
    const int partner = real_rank(v ^ d);
    const std::size_t mid = seg.begin + (seg.end - seg.begin) / 2;
    const bool keep_low = (v & d) == 0;
    const Segment keep = keep_low ? Segment{seg.begin, mid} : Segment{mid, seg.end};
    const Segment give = keep_low ? Segment{mid, seg.end} : Segment{seg.begin, mid};
    const std::uint64_t tag = make_tag(seq, round++);
    auto rw = comm.post_recv(partner, tag, std::as_writable_bytes(std::span<float>(tmp, keep.end - keep.begin)));
    auto sw = comm.post_send(partner, tag, std::as_bytes(data.subspan(give.begin, give.end - give.begin)));
    rw->wait(comm.timeout());
    reduce_into(data.subspan(keep.begin, keep.end - keep.begin),
                std::span<const float>(tmp, keep.end - keep.begin), op);
    sw->wait(comm.timeout());
    path.push_back(seg);
    seg = keep;
  }
  finish(data.subspan(seg.begin, seg.end - seg.begin), op, comm.size());

  // 2. Recursive doubling: retrace the halvings backwards.
  for (auto it = distances.rbegin(); it != distances.rend(); ++it) {
    const int d = *it;
    const int partner = real_rank(v ^ d);
    const Segment whole = path.back();
    path.pop_back();
    const Segment theirs =
        seg.begin == whole.begin ? Segment{seg.end, whole.end} : Segment{whole.begin, seg.begin};
    const std::uint64_t tag = make_tag(seq, round++);
    auto rw = comm.post_recv(partner, tag,
                         std::as_writable_bytes(data.subspan(theirs.begin, theirs.end - theirs.begin)));
    auto sw = comm.post_send(partner, tag, std::as_bytes(data.subspan(seg.begin, seg.end - seg.begin)));
    rw->wait(comm.timeout());
    sw->wait(comm.timeout());
    seg = whole;
  }
}

}  // namespace lockstep::comm::detail
