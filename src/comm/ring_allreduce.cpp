// Ring all-reduce: reduce-scatter, then all-gather, around the ring
// rank r -> r+1 (mod N). The buffer of P bytes is cut into N chunks.
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
// Rounds: 2(N-1). Bytes sent per rank: 2(N-1) chunks = 2P(N-1)/N.
// Latency term: 2(N-1) message latencies.
#include "algorithms.h"

namespace lockstep::comm::detail {

void ring_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t seq) {
  const int n = comm.size();
  const int r = comm.rank();
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  const std::size_t count = data.size();
  auto chunk = [&](int i) {
    i = ((i % n) + n) % n;
    const std::size_t b = chunk_begin(count, n, i);
    return data.subspan(b, chunk_begin(count, n, i + 1) - b);
  };
  const std::size_t max_chunk = (count + n - 1) / n;
  auto scratch_bytes = comm.scratch(max_chunk * sizeof(float));
  auto* scratch = reinterpret_cast<float*>(scratch_bytes.data());

  std::uint32_t round = 0;
  for (int s = 0; s < n - 1; ++s, ++round) {
    auto out = chunk(r - s);
    auto in = chunk(r - s - 1);
    std::span<float> tmp(scratch, in.size());
    auto recv_work = comm.irecv(left, make_tag(seq, round), std::as_writable_bytes(tmp));
    auto send_work = comm.isend(right, make_tag(seq, round), std::as_bytes(out));
    recv_work->wait(comm.timeout());
    reduce_into(in, tmp, op);
    send_work->wait(comm.timeout());
  }
  finish(chunk(r + 1), op, n);
  for (int s = 0; s < n - 1; ++s, ++round) {
    auto out = chunk(r + 1 - s);
    auto in = chunk(r - s);
    auto recv_work = comm.irecv(left, make_tag(seq, round), std::as_writable_bytes(in));
    auto send_work = comm.isend(right, make_tag(seq, round), std::as_bytes(out));
    recv_work->wait(comm.timeout());
    send_work->wait(comm.timeout());
  }
}

}  // namespace lockstep::comm::detail
