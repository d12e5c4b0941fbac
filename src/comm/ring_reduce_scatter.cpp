// Ring reduce-scatter and ring all-gather: the two halves of the ring
// all-reduce, as collectives of their own.
//
// Reduce-scatter, rounds s = 0..N-2: send chunk (r-s-1) mod N to r+1; receive
// chunk (r-s-2) mod N from r-1 and reduce it into our working copy. After
// N-1 rounds rank r holds the full reduction of chunk r.
//   Rounds: N-1. Bytes sent per rank: P(N-1)/N.
// All-gather, rounds s = 0..N-2: send block (r-s) mod N to r+1; receive block
// (r-s-1) mod N from r-1 straight into place.
//   Rounds: N-1. Bytes sent per rank: (N-1) x block.
#include <cstring>

#include "algorithms.h"
#include "fingerprint.h"
#include "lockstep/error.h"

namespace lockstep::comm {

void reduce_scatter(Communicator& comm, std::span<const float> in, std::span<float> out, ReduceOp op) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t count = in.size();
  const std::size_t mine = detail::chunk_begin(count, n, r);
  if (out.size() != detail::chunk_begin(count, n, r + 1) - mine) {
    refuse_call(comm, "reduce_scatter: rank " + std::to_string(r) + " needs an output of " +
                                   std::to_string(detail::chunk_begin(count, n, r + 1) - mine) +
                                   " elements, got " + std::to_string(out.size()));
  }
  const detail::CollectiveScope scope(comm, "reduce_scatter");
  const Fingerprint fp =
      detail::start_collective(comm, CollectiveKind::ReduceScatter, op, DataType::Float32, count);
  detail::run_collective(comm, fp, [&] {
    comm.check_fingerprint(fp);
    // Working copy of the input, then the received chunk, in one scratch block.
    const std::size_t max_chunk = (count + n - 1) / n;
    auto bytes = comm.scratch((count + max_chunk) * sizeof(float));
    std::span<float> work(reinterpret_cast<float*>(bytes.data()), count);
    float* tmp = work.data() + count;
    std::copy(in.begin(), in.end(), work.begin());  // not memcpy: empty spans may be null
    auto chunk = [&](int i) {
      i = ((i % n) + n) % n;
      const std::size_t b = detail::chunk_begin(count, n, i);
      return work.subspan(b, detail::chunk_begin(count, n, i + 1) - b);
    };
    for (int s = 0; s < n - 1; ++s) {
      auto send_chunk = chunk(r - s - 1);
      auto recv_chunk = chunk(r - s - 2);
      const std::uint64_t tag = detail::make_tag(fp.sequence, static_cast<std::uint32_t>(s));
      auto rw =
          comm.post_recv((r - 1 + n) % n, tag, std::as_writable_bytes(std::span<float>(tmp, recv_chunk.size())));
      auto sw = comm.post_send((r + 1) % n, tag, std::as_bytes(send_chunk));
      rw->wait(comm.timeout());
      detail::reduce_into(recv_chunk, std::span<const float>(tmp, recv_chunk.size()), op);
      sw->wait(comm.timeout());
    }
    auto result = chunk(r);
    detail::finish(result, op, n);
    std::copy(result.begin(), result.end(), out.begin());
  });
}

void all_gather(Communicator& comm, std::span<const float> in, std::span<float> out) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t block = in.size();
  if (out.size() != block * static_cast<std::size_t>(n)) {
    refuse_call(comm, "all_gather: the output must hold " + std::to_string(n) + " x " +
                                   std::to_string(block) + " elements, got " + std::to_string(out.size()));
  }
  const detail::CollectiveScope scope(comm, "all_gather");
  const Fingerprint fp =
      detail::start_collective(comm, CollectiveKind::AllGather, ReduceOp::Sum, DataType::Float32, block);
  detail::run_collective(comm, fp, [&] {
    comm.check_fingerprint(fp);
    auto at = [&](int i) { return out.subspan(static_cast<std::size_t>(((i % n) + n) % n) * block, block); };
    std::copy(in.begin(), in.end(), at(r).begin());
    for (int s = 0; s < n - 1; ++s) {
      const std::uint64_t tag = detail::make_tag(fp.sequence, static_cast<std::uint32_t>(s));
      auto rw = comm.post_recv((r - 1 + n) % n, tag, std::as_writable_bytes(at(r - s - 1)));
      auto sw = comm.post_send((r + 1) % n, tag, std::as_bytes(at(r - s)));
      rw->wait(comm.timeout());
      sw->wait(comm.timeout());
    }
  });
}

}  // namespace lockstep::comm
