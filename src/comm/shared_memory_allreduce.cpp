// Shared-memory all-reduce: the threads backend's native path.
//
// Every rank's buffer lives in one address space, so a rank can reduce its
// own chunk straight out of all the others' buffers:
//
//   1. publish: rank r puts its buffer pointer and count in the hub;  barrier.
//   2. reduce-scatter + all-gather in one pass: rank r reads chunk r of all N
//      buffers, reduces them in the balanced binary tree over rank index
//      (Note [Tree order] in tree_allreduce.cpp: ((v0+v1)+(v2+v3))+..., so the
//      sum is the same on every run and, for a power-of-two N, the same bits as
//      the tree all-reduce and as one rank tree-summing the same inputs),
//      applies op (and 1/N for Mean), and writes the result into chunk r of
//      all N buffers;  barrier. For Sum and Mean over up to 16 ranks the
//      tree is evaluated element by element in one pass (fused_tree_sum), so
//      no partial sum goes through memory.
//
// Synchronisations: 2 barriers (the ring needs 2(N-1) hand-offs); 1 for
// buffers of at most 16 KiB, which are staged (Note [Small all-reduces in one
// barrier]).
// Memory traffic: every input read once and every output written once,
// 2·N·P bytes in all for P bytes per rank.
// Bytes "sent" per rank, counted as the ring counts them: the P - P/N bytes
// of its buffer that other ranks read, plus its chunk written into N-1 other
// buffers: 2P(N-1)/N. Every rank ends with the same bytes: each chunk is
// computed once, by its owner, and copied.
#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <utility>
#include <vector>

#include "algorithms.h"
#include "lockstep/error.h"
#include "threads_hub.h"

namespace lockstep::comm::detail {

namespace {

constexpr int kMaxRanks = 1024;  // the trainer's limit; make_thread_group refuses more

std::size_t tree_levels(int n) {
  std::size_t levels = 1;
  while ((1 << levels) < n) ++levels;
  return levels;
}

// out[0..len) = op over inputs[lo..hi) in the balanced tree over their index
// (halves split at the largest power of two below the count, so a
// power-of-two count gives the perfectly balanced tree). `tmp` holds one
// scratch block per tree level below this one.
void tree_reduce(const float* const* inputs, int lo, int hi, float* out, float* tmp, std::size_t len,
                 ReduceOp op) {
  if (hi - lo == 1) {
    std::copy_n(inputs[lo], len, out);  // not memcpy: an empty buffer may be null
    return;
  }
  int half = 1;
  while (half * 2 < hi - lo) half *= 2;
  if (half == 1 && hi - lo == 2) {  // a leaf pair: no copy
    std::copy_n(inputs[lo], len, out);
    reduce_into({out, len}, {inputs[lo + 1], len}, op);
    return;
  }
  tree_reduce(inputs, lo, lo + half, out, tmp + len, len, op);
  tree_reduce(inputs, lo + half, hi, tmp, tmp + len, len, op);
  reduce_into({out, len}, {tmp, len}, op);
}

// The tree of tree_reduce over N inputs, one element at a time: the same
// additions in the same order, so the same bits, in one pass that reads each
// input once and keeps the partial sums in registers. tree_reduce is its
// naive sibling, which the tests hold it to, and still serves Max, Min and
// more than kMaxFusedRanks ranks.
template <int N>
inline float tree_sum_at(const float* const* in, std::size_t i) {
  if constexpr (N == 1) {
    return in[0][i];
  } else {
    constexpr int half = std::bit_floor(unsigned(N - 1));  // the largest power of two below N
    return tree_sum_at<half>(in, i) + tree_sum_at<N - half>(in + half, i);
  }
}

// out[i] = tree sum of in[0..N)[i], times `scale` when `mean` (finish()'s
// multiplication, fused).
template <int N>
void fused_tree_sum(const float* const* inputs, float* __restrict out, std::size_t len, bool mean, float scale) {
  const float* in[N];
  for (int j = 0; j < N; ++j) in[j] = inputs[j];
  if (mean) {
    for (std::size_t i = 0; i < len; ++i) out[i] = tree_sum_at<N>(in, i) * scale;
  } else {
    for (std::size_t i = 0; i < len; ++i) out[i] = tree_sum_at<N>(in, i);
  }
}

constexpr int kMaxFusedRanks = 16;

// Sum and Mean over 2..kMaxFusedRanks inputs in one pass; false if the call
// is not one of those (the caller then takes tree_reduce and finish()).
template <int... Ns>
bool fused_reduce(std::integer_sequence<int, Ns...>, const float* const* inputs, int n, float* out,
                  std::size_t len, ReduceOp op) {
  if (op != ReduceOp::Sum && op != ReduceOp::Mean) return false;
  const bool mean = op == ReduceOp::Mean;
  const float scale = 1.0f / static_cast<float>(n);
  return ((n == Ns + 2 ? (fused_tree_sum<Ns + 2>(inputs, out, len, mean, scale), true) : false) || ...);
}

bool fused_reduce(const float* const* inputs, int n, float* out, std::size_t len, ReduceOp op) {
  return fused_reduce(std::make_integer_sequence<int, kMaxFusedRanks - 1>(), inputs, n, out, len, op);
}

// Note [Small all-reduces in one barrier]: below kStagedMaxBytes each rank
// copies its input into a staging buffer of the hub, waits once, and then sums
// all N staged inputs itself, in rank order, into its own buffer. Every rank
// runs the same additions in the same order, so the results are bitwise
// identical, and no rank writes another's memory, so no second barrier is
// needed. The staging buffers alternate with the call's parity: a rank can
// only stage call s+2 after every rank has passed call s+1's barrier, and so
// has finished reading call s's. Each rank reads N x P bytes instead of P,
// which is cheaper than a barrier while N x P stays in cache.
void staged_allreduce(Hub& hub, int rank, std::span<float> data, const Fingerprint& fp, bool verify,
                      Duration timeout) {
  auto& staging = hub.staging[fp.sequence % 2];
  std::vector<float>& mine = staging[rank];
  mine.assign(data.begin(), data.end());
  publish_and_check(hub, rank, fp, verify, timeout);
  const int n = hub.size();
  std::array<const float*, kMaxRanks> inputs;
  for (int j = 0; j < n; ++j) inputs[j] = staging[j].data();
  if (fused_reduce(inputs.data(), n, data.data(), data.size(), fp.op)) return;
  std::vector<float>& tmp = hub.tree_scratch[rank];  // one block per tree level
  if (tmp.size() < data.size() * tree_levels(n)) tmp.resize(data.size() * tree_levels(n));
  tree_reduce(inputs.data(), 0, n, data.data(), tmp.data(), data.size(), fp.op);
  finish(data, fp.op, n);
}

// Reduces chunk `c` of every rank's published buffer (hub.slots) into chunk
// c of the buffers `targets` (all ranks', or only this rank's).
// 32 KiB blocks: the partial sum stays in L1, and each of the 2N streams a
// block touches is long enough for the hardware prefetchers. Measured with
// `lockstep bench allreduce` at N = 8: 4 KiB blocks reach 0.67 of memcpy
// bandwidth at 64 MiB, 32 KiB blocks 0.9 (docs/results.md).
void reduce_chunk(Hub& hub, int rank, std::size_t count, int c, ReduceOp op, std::span<float* const> targets) {
  const int n = hub.size();
  const std::size_t begin = chunk_begin(count, n, c), end = chunk_begin(count, n, c + 1);
  constexpr std::size_t kBlock = 8192;
  std::vector<float>& scratch = hub.tree_scratch[rank];  // acc, then one block per tree level
  if (scratch.size() < kBlock * (tree_levels(n) + 1)) scratch.resize(kBlock * (tree_levels(n) + 1));
  float* acc = scratch.data();
  std::array<const float*, kMaxRanks> inputs;
  for (std::size_t b = begin; b < end; b += kBlock) {
    const std::size_t len = std::min(kBlock, end - b);
    for (int j = 0; j < n; ++j) inputs[j] = hub.slots[j] + b;
    if (!fused_reduce(inputs.data(), n, acc, len, op)) {
      tree_reduce(inputs.data(), 0, n, acc, acc + kBlock, len, op);
      finish({acc, len}, op, n);
    }
    for (float* t : targets) std::memcpy(t + b, acc, len * sizeof(float));
  }
}

}  // namespace

void shared_memory_allreduce(Hub& hub, int rank, std::span<float> data, const Fingerprint& fp, bool verify,
                             Duration timeout) {
  if (data.size_bytes() <= kStagedMaxBytes) return staged_allreduce(hub, rank, data, fp, verify, timeout);
  hub.slots[rank] = data.data();
  publish_and_check(hub, rank, fp, verify, timeout);
  reduce_chunk(hub, rank, data.size(), rank, fp.op, hub.slots);
  // Note [Nobody leaves while others write]: past the first barrier every
  // rank writes into every other rank's buffer, so no rank may return (and
  // perhaps free its buffer) before all have finished. Phase 2 cannot block,
  // so this barrier ignores aborts and waits for everyone.
  hub.barrier(rank, timeout, fp, /*interruptible=*/false);
}

// The halves (sharded_collectives.cpp), each with the same two barriers: rank
// r owns chunk (r+1) mod N, as after the ring's reduce-scatter. The
// reduce-scatter writes only this rank's own buffer, but others read it until
// the second barrier; the all-gather writes into everyone's.
void shared_memory_reduce_scatter(Hub& hub, int rank, std::span<float> data, const Fingerprint& fp, bool verify,
                                  Duration timeout) {
  hub.slots[rank] = data.data();
  publish_and_check(hub, rank, fp, verify, timeout);
  float* const mine[] = {data.data()};
  reduce_chunk(hub, rank, data.size(), (rank + 1) % hub.size(), fp.op, mine);
  hub.barrier(rank, timeout, fp, /*interruptible=*/false);  // the others may still be reading this buffer
}

void shared_memory_all_gather(Hub& hub, int rank, std::span<float> data, const Fingerprint& fp, bool verify,
                              Duration timeout) {
  const int n = hub.size();
  hub.slots[rank] = data.data();
  publish_and_check(hub, rank, fp, verify, timeout);
  const int c = (rank + 1) % n;
  const std::size_t begin = chunk_begin(data.size(), n, c), end = chunk_begin(data.size(), n, c + 1);
  for (int j = 0; j < n; ++j) {
    if (j != rank && end > begin) std::memcpy(hub.slots[j] + begin, data.data() + begin, (end - begin) * sizeof(float));
  }
  hub.barrier(rank, timeout, fp, /*interruptible=*/false);  // Note [Nobody leaves while others write]
}

}  // namespace lockstep::comm::detail
