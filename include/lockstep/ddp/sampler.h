// The distributed sampler: which samples each replica sees at each step.
//
// Each epoch has one global order of the sample indices, drawn from
// (seed, epoch) with a fully specified generator, so every replica computes
// the same order on its own without communicating. Step s of an epoch takes
// the global batch at positions [s*B, s*B + B) of that order (B = N x
// micro-batch) and cuts it into N disjoint, contiguous micro-batches: replica
// r takes the r-th. With shuffle off the order is the file order.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::ddp {

// What to do with an epoch's last global batch when fewer than B samples remain.
enum class LastBatch {
  Drop,  // skip it (every step has exactly B samples)
  Keep,  // use it, cut as evenly as possible; replicas get ragged shards
};

struct SamplerOptions {
  std::int64_t dataset_size = 0;
  int world_size = 1;
  std::int64_t micro_batch = 1;
  bool shuffle = true;
  std::uint64_t seed = 0;
  LastBatch last_batch = LastBatch::Drop;
};

struct Shard {
  std::int64_t begin = 0;         // position in the epoch order
  std::int64_t end = 0;           // one past the last position
  std::int64_t global_count = 0;  // samples in this step's global batch
  std::int64_t size() const { return end - begin; }
};

class DistributedSampler {
 public:
  // Throws InvalidArgument for an empty data set, world_size < 1,
  // micro_batch < 1, or a global batch larger than the data set.
  explicit DistributedSampler(const SamplerOptions& options);

  std::int64_t global_batch() const { return global_batch_; }
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  std::int64_t dataset_size() const { return options_.dataset_size; }
  // The epoch's order of sample indices; the same on every replica. Throws
  // InvalidArgument for a negative epoch.
  std::vector<std::int64_t> epoch_order(std::int64_t epoch) const;
  // Replica `rank`'s micro-batch at `step` (0-based, within an epoch).
  Shard shard(std::int64_t step, int rank) const;

 private:
  SamplerOptions options_;
  std::int64_t global_batch_;
  std::int64_t steps_per_epoch_;
};

}  // namespace lockstep::ddp
