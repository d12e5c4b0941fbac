// Private to src/ddp: the weight of one replica's gradient sum in a mean
// all-reduce over ragged shards (the reducer and average_gradients).
#pragma once

#include <cstdint>

namespace lockstep::ddp::detail {

// n x local / global, so that the mean of the weighted gradients is the mean
// over all samples; exactly 1 for equal shards. In 128 bits: local x n
// overflows 64 for counts past 2^63 / n.
inline float ragged_weight(std::int64_t local_count, std::int64_t n, std::int64_t global_count) {
  if (static_cast<__int128>(local_count) * n == global_count) return 1.0f;
  return static_cast<float>(double(n) * double(local_count) / double(global_count));
}

}  // namespace lockstep::ddp::detail
