// Private: where each replica's shard of the optimizer state lies, under
// --zero 1 (run_replica gathers and scatters it for checkpoints).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "lockstep/ddp/reducer.h"

namespace lockstep::train::detail {

// --zero 1 (Note [Sharded optimizer state]): every replica's ranges of the
// parameters (ddp::owned_ranges) and the widest shard. Shards differ by up
// to one element a bucket, so in a gather or scatter each travels padded to
// the widest. pack() and unpack() move replica r's ranges of one slot of the
// whole state (laid out as the P parameters) to and from its padded block.
struct ShardLayout {
  std::vector<std::vector<ddp::GradRange>> ranges;
  std::size_t widest = 0;
  ShardLayout(const std::vector<ddp::Bucket>& buckets, int world_size) {
    for (int r = 0; r < world_size; ++r) {
      ranges.push_back(ddp::owned_ranges(buckets, r, world_size));
      std::size_t numel = 0;
      for (const auto& g : ranges.back()) numel += g.numel;
      widest = std::max(widest, numel);
    }
  }
  void pack(std::span<const float> whole_slot, int r, std::span<float> block) const {
    float* to = block.data();
    for (const auto& g : ranges[std::size_t(r)]) to = std::copy_n(whole_slot.data() + g.offset, g.numel, to);
  }
  void unpack(std::span<const float> block, int r, std::span<float> whole_slot) const {
    const float* from = block.data();
    for (const auto& g : ranges[std::size_t(r)]) {
      std::copy_n(from, g.numel, whole_slot.data() + g.offset);
      from += g.numel;
    }
  }
};

}  // namespace lockstep::train::detail
