// Ring all-reduce: reduce-scatter, then all-gather, around the ring
// rank r -> r+1 (mod N). The buffer of P bytes is cut into N chunks, and each
// chunk into m segments of at most the segment size (4 MiB unless
// AllreduceOptions says otherwise; m = 1 for chunks that small), so that a
// segment is on the wire while the one before it is reduced.
//
//   Reduce-scatter, rounds s = 0..N-2:
//     send chunk (r-s) mod N to r+1; recv chunk (r-s-1) mod N from r-1 into
//     scratch; add it into our copy. After N-1 rounds rank r holds the full
//     reduction of chunk (r+1) mod N (scaled by 1/N for Mean).
//   All-gather, rounds s = 0..N-2:
//     send chunk (r+1-s) mod N to r+1; recv chunk (r-s) mod N from r-1
//     straight into place. Every rank ends with the same bytes, because each
//     reduced chunk was computed once and then copied.
//
//   Pipelining: what a rank sends in round s+1 is what it received (and, in
//   the reduce-scatter, reduced) in round s. So segment j goes out for round
//   s+1 as soon as segment j of round s is in, and receives are posted one
//   round ahead, into two alternating scratch buffers. The summation order is
//   the same as without segments: every element is reduced in the same
//   rounds, in the same order.
//
// Rounds: 2(N-1). Bytes sent per rank: 2(N-1) chunks = 2P(N-1)/N, in
// 2(N-1)m messages. Latency term: about 2(N-1) + m - 1 message latencies.
//
// ring_rounds runs any range of those rounds over any ring of ranks (a
// RingGroup), so that the hierarchical all-reduce can reduce-scatter inside
// a node, all-reduce across nodes and all-gather inside the node again.
#include <memory>
#include <vector>

#include "algorithms.h"

namespace lockstep::comm::detail {

void ring_rounds(Communicator& comm, const RingGroup& g, std::span<float> data, ReduceOp op,
                 std::uint64_t seq, std::size_t segment_bytes, int first, int last, int mean_over) {
  const int n = static_cast<int>(g.ranks.size());
  const int r = g.me;
  const int right = g.ranks[static_cast<std::size_t>((r + 1) % n)];
  const int left = g.ranks[static_cast<std::size_t>((r - 1 + n) % n)];
  const std::size_t count = data.size();
  auto chunk = [&](int i) {
    i = ((i % n) + n) % n;
    const std::size_t b = chunk_begin(count, n, i);
    return data.subspan(b, chunk_begin(count, n, i + 1) - b);
  };
  const std::size_t max_chunk = (count + n - 1) / n;
  const int rounds = 2 * (n - 1);
  const int m = ring_segments(max_chunk * sizeof(float), g.first_tag + rounds, segment_bytes);
  // Segment j of a chunk of `size` elements: the same cut on every rank.
  auto segment = [&](std::span<float> c, int j) {
    const std::size_t b = chunk_begin(c.size(), m, j);
    return c.subspan(b, chunk_begin(c.size(), m, j + 1) - b);
  };
  auto tag = [&](int round, int j) {
    return make_tag(seq, static_cast<std::uint32_t>((g.first_tag + round) * m + j));
  };
  auto scratch_bytes = comm.scratch(2 * max_chunk * sizeof(float));
  auto* scratch = reinterpret_cast<float*>(scratch_bytes.data());
  auto landing = [&](int round) -> std::span<float> {  // where round's segments arrive
    if (round >= n - 1) return chunk(r - (round - (n - 1)));  // all-gather: in place
    return {scratch + (round % 2) * max_chunk, chunk(r - round - 1).size()};
  };
  // What round s sends: the reduce-scatter starts with our own chunk, the
  // all-gather with the chunk the reduce-scatter completed here.
  auto sent_in = [&](int round) { return round < n - 1 ? chunk(r - round) : chunk(r + 1 - (round - (n - 1))); };

  using Works = std::vector<std::unique_ptr<Work>>;
  std::vector<Works> recvs(rounds), sends(rounds);
  auto post_recvs = [&](int round) {
    if (round >= last) return;
    auto into = landing(round);
    for (int j = 0; j < m; ++j)
      recvs[round].push_back(comm.post_recv(left, tag(round, j), std::as_writable_bytes(segment(into, j))));
  };
  auto post_send = [&](int round, std::span<const float> seg, int j) {
    if (round < last) sends[round].push_back(comm.post_send(right, tag(round, j), std::as_bytes(seg)));
  };

  post_recvs(first);
  post_recvs(first + 1);
  for (int j = 0; j < m; ++j) post_send(first, segment(sent_in(first), j), j);
  for (int round = first; round < last; ++round) {
    const bool reducing = round < n - 1;
    auto in = reducing ? chunk(r - round - 1) : chunk(r - (round - (n - 1)));
    auto arrived = landing(round);
    for (int j = 0; j < m; ++j) {
      recvs[round][j]->wait(comm.timeout());
      auto seg = segment(in, j);
      if (reducing) {
        reduce_into(seg, segment(arrived, j), op);
        if (round == n - 2 && mean_over > 0) finish(seg, op, mean_over);  // chunk (r+1) is complete
      }
      post_send(round + 1, seg, j);  // round+1 sends what round received
    }
    for (auto& w : sends[round]) w->wait(comm.timeout());
    // Round+2 lands where round did (scratch), or later in place: post it now.
    post_recvs(round + 2);
  }
}

void ring_rounds(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t seq,
                 std::size_t segment_bytes, int first, int last, int mean_over) {
  std::vector<int> everyone(static_cast<std::size_t>(comm.size()));
  for (int i = 0; i < comm.size(); ++i) everyone[static_cast<std::size_t>(i)] = i;
  ring_rounds(comm, {everyone, comm.rank(), 0}, data, op, seq, segment_bytes, first, last, mean_over);
}

void ring_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t seq,
                    std::size_t segment_bytes) {
  const int n = comm.size();
  ring_rounds(comm, data, op, seq, segment_bytes, 0, 2 * (n - 1), n);
}

}  // namespace lockstep::comm::detail
