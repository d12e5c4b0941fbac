// Private: the all-reduce algorithms behind comm::allreduce, one per file,
// and the element-wise kernels they share.
#pragma once

#include <cstdint>
#include <span>

#include "lockstep/comm/collectives.h"

namespace lockstep::comm::detail {

// Tag of round `round` of collective number `sequence`.
inline std::uint64_t make_tag(std::uint64_t sequence, std::uint32_t round) {
  return (sequence << 16) | (round & 0xffffu);
}

// acc[i] = op(acc[i], in[i]) for Sum/Mean (sum), Max, Min.
void reduce_into(std::span<float> acc, std::span<const float> in, ReduceOp op);
// Final step of Mean: data[i] *= 1/world_size. No-op for other ops.
void finish(std::span<float> data, ReduceOp op, int world_size);

// [begin, end) of chunk `i` when `count` elements are cut into `n` chunks.
inline std::size_t chunk_begin(std::size_t count, int n, int i) {
  return count * static_cast<std::size_t>(i) / static_cast<std::size_t>(n);
}

void ring_allreduce(Communicator& comm, std::span<float> data, ReduceOp op);
void naive_allreduce(Communicator& comm, std::span<float> data, ReduceOp op);

}  // namespace lockstep::comm::detail
