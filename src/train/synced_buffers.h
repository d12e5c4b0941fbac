// --bn-stats sync: what a step adds to the buffers every replica applies
// (Note [Synchronised buffers], synced_buffers.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lockstep/ddp/sampler.h"
#include "lockstep/nn/arena.h"

namespace lockstep::train::detail {

// Offsets in `buffers` of the step counters (PyTorch's num_batches_tracked,
// one per batch norm): they count forwards, not samples.
std::vector<std::size_t> counter_offsets(const nn::Layout& buffers);

// How many of a step's `accumulate` micro-steps have a sample on some
// replica: the forwards a batch norm synchronised at every forward would
// count. Replica r takes rows [rows_r k / K, rows_r (k+1) / K) in micro-step
// k, of which those below its shard's size are samples; rows_r is its shard's
// size, or with `pad` the largest shard's.
std::int64_t micro_steps_with_samples(const ddp::DistributedSampler& sampler, std::int64_t step_in_epoch,
                                      int world_size, std::int64_t accumulate, bool pad);

}  // namespace lockstep::train::detail
