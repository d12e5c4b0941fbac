// Shared-memory all-reduce: the threads backend's native path.
//
// Every rank's buffer lives in one address space, so a rank can reduce its
// own chunk straight out of all the others' buffers:
//
//   1. publish: rank r puts its buffer pointer and count in the hub;  barrier.
//   2. reduce-scatter + all-gather in one pass: rank r reads chunk r of all N
//      buffers (in rank order 0..N-1, so the sum is the same on every run),
//      applies op (and 1/N for Mean), and writes the result into chunk r of
//      all N buffers;  barrier.
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
#include <cstring>
#include <vector>

#include "algorithms.h"
#include "lockstep/error.h"
#include "threads_hub.h"

namespace lockstep::comm::detail {

namespace {

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
  std::copy(staging[0].begin(), staging[0].end(), data.begin());
  for (int j = 1; j < hub.size(); ++j) reduce_into(data, staging[j], fp.op);
  finish(data, fp.op, hub.size());
}

}  // namespace

void shared_memory_allreduce(Hub& hub, int rank, std::span<float> data, const Fingerprint& fp, bool verify,
                             Duration timeout) {
  if (data.size_bytes() <= kStagedMaxBytes) return staged_allreduce(hub, rank, data, fp, verify, timeout);
  const int n = hub.size();
  const ReduceOp op = fp.op;
  hub.slots[rank] = data.data();
  publish_and_check(hub, rank, fp, verify, timeout);
  const std::size_t count = data.size();
  const std::size_t begin = chunk_begin(count, n, rank), end = chunk_begin(count, n, rank + 1);
  // 32 KiB blocks: the partial sum stays in L1, and each of the 2N streams a
  // block touches is long enough for the hardware prefetchers. Measured with
  // `lockstep bench allreduce` at N = 8: 4 KiB blocks reach 0.67 of memcpy
  // bandwidth at 64 MiB, 32 KiB blocks 0.9 (docs/results.md).
  constexpr std::size_t kBlock = 8192;
  alignas(64) float acc[kBlock];
  for (std::size_t b = begin; b < end; b += kBlock) {
    const std::size_t len = std::min(kBlock, end - b);
    std::memcpy(acc, hub.slots[0] + b, len * sizeof(float));
    for (int j = 1; j < n; ++j) reduce_into({acc, len}, {hub.slots[j] + b, len}, op);
    finish({acc, len}, op, n);
    for (int j = 0; j < n; ++j) std::memcpy(hub.slots[j] + b, acc, len * sizeof(float));
  }
  // Note [Nobody leaves while others write]: past the first barrier every
  // rank writes into every other rank's buffer, so no rank may return (and
  // perhaps free its buffer) before all have finished. Phase 2 cannot block,
  // so this barrier ignores aborts and waits for everyone.
  hub.barrier(rank, timeout, fp, /*interruptible=*/false);
}

}  // namespace lockstep::comm::detail
