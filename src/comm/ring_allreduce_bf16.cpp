// Ring all-reduce with bfloat16 on the wire: the ring of ring_allreduce.cpp
// (rank r -> r+1 mod N, the buffer cut into N chunks), with every chunk sent
// as bf16. Sum and Mean only.
//
//   Reduce-scatter, rounds s = 0..N-2:
//     send bf16 chunk (r-s) mod N to r+1 (at s = 0 our own contribution,
//     later the partial sum rounded in the previous round); recv bf16 chunk
//     (r-s-1) mod N from r-1 into scratch; add our contribution to it in
//     float (scratch), then round to bf16 once, into our copy, to send it on.
//     In round N-2 the sum is complete: rank r holds chunk (r+1) mod N, scales
//     it by 1/N in float for Mean, and rounds it to bf16 once.
//   All-gather, rounds s = 0..N-2:
//     send bf16 chunk (r+1-s) mod N to r+1; recv bf16 chunk (r-s) mod N from
//     r-1 straight into place. Every rank ends with the same bytes, because
//     each reduced chunk was rounded once, by one rank, and then copied.
//
// Rounds: 2(N-1). Bytes sent per rank: 2(N-1) chunks of count/N bf16 values
// = 2(N-1)/N x 2 bytes per element, half the float ring's 2(N-1)/N x 4.
// Latency term: 2(N-1) message latencies. Memory: scratch of one chunk as
// float (the partial sum) plus two as bf16 (received chunks: receives are
// posted two rounds ahead, Note [Receive ahead]).
//
// Note [bf16 all-reduce error bound]
// The chunk that starts at rank c sums x_1..x_N (bf16 values, in ring order
// from c): p_1 = x_1, p_k = bf16(p_{k-1} + x_k) for k = 2..N, so there are
// N-1 roundings to bf16, the last one the result's. A rounding to bf16 has
// relative error at most u = 2^-8 (8 significant bits; the float addition
// before it adds 2^-24, and Mean's scaling by fl(1/N) two more). Recursive
// summation then gives (Higham, Accuracy and Stability, 4.2)
//   |result - sum x_i| <= gamma_{N-1} sum |x_i|,  gamma_k = k u' / (1 - k u'),
// u' = u + O(2^-23); and gamma_{N-1} <= N 2^-8 while N(N-1) u' <= 1, i.e.
// for N <= 16. Mean divides both sides by N. Results in bf16's subnormal
// range add at most half a subnormal step (2^-134) per rounding.
// The error is relative to sum |x_i|, not |sum x_i|: with cancellation the
// relative error of the result is unbounded, as for any low-precision sum.
#include <memory>
#include <string>
#include <vector>

#include "algorithms.h"
#include "fingerprint.h"
#include "lockstep/comm/bf16.h"
#include "lockstep/error.h"

namespace lockstep::comm {
namespace {

// acc[i] = from_bf16(wire[i]) + from_bf16(own[i]), in float.
void add_in_float(std::span<const std::uint16_t> wire, std::span<const std::uint16_t> own,
                  std::span<float> acc) {
  from_bf16(wire, acc);
  const std::uint16_t* __restrict b = own.data();
  float* __restrict a = acc.data();
  const std::size_t n = acc.size();
  for (std::size_t i = 0; i < n; ++i) a[i] += from_bf16(b[i]);
}

void ring_allreduce_bf16(Communicator& comm, std::span<std::uint16_t> data, ReduceOp op, std::uint64_t seq) {
  const int n = comm.size();
  const int r = comm.rank();
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  const std::size_t count = data.size();
  auto chunk = [&](int i) {
    i = ((i % n) + n) % n;
    const std::size_t b = detail::chunk_begin(count, n, i);
    return data.subspan(b, detail::chunk_begin(count, n, i + 1) - b);
  };
  // Scratch: the float partial sum, then two received bf16 chunks (the
  // float part first keeps all aligned): receives are posted ahead (Note
  // [Receive ahead]), into the wire buffer no round in flight reads.
  const std::size_t max_chunk = (count + n - 1) / n;
  auto scratch = comm.scratch(max_chunk * (sizeof(float) + 2 * sizeof(std::uint16_t)));
  auto* acc_base = reinterpret_cast<float*>(scratch.data());
  auto* wire_base = reinterpret_cast<std::uint16_t*>(scratch.data() + max_chunk * sizeof(float));
  const int rounds = 2 * (n - 1);
  auto wire = [&](int round) {  // the reduce-scatter's receive buffer of `round`
    return std::span<std::uint16_t>(wire_base + (round % 2) * max_chunk, chunk(r - round - 1).size());
  };
  auto post_recv = [&](int round) -> std::unique_ptr<Work> {
    if (round >= rounds) return nullptr;
    const auto into = round < n - 1 ? wire(round) : chunk(r - (round - (n - 1)));  // all-gather: in place
    return comm.post_recv(left, detail::make_tag(seq, static_cast<std::uint32_t>(round)), std::as_writable_bytes(into));
  };

  // Note [Receive ahead]
  // Gloo's TCP pairs, like MPI's rendezvous protocol for large messages, move
  // a message's bytes only once its receive is posted. Posted at the start of
  // its own round, and with each round's send waiting for the one before, every
  // round paid a notification's round trip before its first byte, and across
  // shaped links the bf16 ring took twice the float ring's time for half its
  // bytes (docs/results.md). So, as the float ring does: receives are posted
  // two rounds ahead, and round s+1's send leaves as soon as round s's data
  // is in (and reduced), before round s's own send has finished. The buffers
  // do not collide: the reduce-scatter alternates two wire buffers (round s+2
  // is posted once round s's was read), and the all-gather's round g lands in
  // chunk r-g, which the reduce-scatter wrote in its round g-1 and sent in
  // its round g; that receive is posted after round N-3+g's send finished,
  // so after both, for N >= 3. With N = 2 all-gather round 0 (chunk r) would
  // be posted while round 0 still sends chunk r, so it waits for that send.
  std::vector<std::unique_ptr<Work>> recvs(static_cast<std::size_t>(rounds));
  auto sent_in = [&](int round) { return round < n - 1 ? chunk(r - round) : chunk(r + 1 - (round - (n - 1))); };
  auto send = [&](int round) {
    return comm.post_send(right, detail::make_tag(seq, static_cast<std::uint32_t>(round)), std::as_bytes(sent_in(round)));
  };
  recvs[0] = post_recv(0);
  if (n > 2) recvs[1] = post_recv(1);
  std::unique_ptr<Work> send_work = send(0);
  for (int round = 0; round < rounds; ++round) {
    recvs[static_cast<std::size_t>(round)]->wait(comm.timeout());
    if (round < n - 1) {  // reduce-scatter: add our values, round once
      auto in = chunk(r - round - 1);
      std::span<float> acc(acc_base, in.size());
      add_in_float(wire(round), in, acc);
      if (round == n - 2) detail::finish(acc, op, n);  // the chunk is complete: Mean's 1/N, in float
      to_bf16(acc, in);                                // the one rounding of this partial sum
    }
    std::unique_ptr<Work> next_send = round + 1 < rounds ? send(round + 1) : nullptr;  // what round received
    send_work->wait(comm.timeout());
    send_work = std::move(next_send);
    if (n == 2 && round == 0) recvs[1] = post_recv(1);
    if (round + 2 < rounds) recvs[static_cast<std::size_t>(round + 2)] = post_recv(round + 2);
  }
}

}  // namespace

void allreduce_bf16(Communicator& comm, std::span<std::uint16_t> data, ReduceOp op, std::uint64_t global_batch) {
  if (op != ReduceOp::Sum && op != ReduceOp::Mean) {
    refuse_call(comm, std::string("allreduce_bf16: op ") + to_string(op) +
                                   " is not supported; the choices are sum and mean");
  }
  const detail::CollectiveScope scope(comm, "allreduce_bf16");
  Fingerprint fp =
      detail::start_collective(comm, CollectiveKind::Allreduce, op, DataType::BFloat16, data.size());
  if (comm.size() == 1) return;                                // Sum and Mean over one rank are the identity
  fp.algorithm = static_cast<std::uint32_t>(Algorithm::Ring);  // ranks must agree on it too
  fp.global_batch = global_batch;
  detail::run_collective(comm, fp, [&] {
    comm.check_fingerprint(fp);
    ring_allreduce_bf16(comm, data, op, fp.sequence);
  });
}

}  // namespace lockstep::comm
