#include "lockstep/ddp/sampler.h"

#include <numeric>
#include <random>
#include <string>

#include "lockstep/error.h"

namespace lockstep::ddp {
namespace {

// Uniform integer in [0, bound) from a fully specified engine (no
// implementation-defined distribution), by rejection.
std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t bound) {
  const std::uint64_t limit = UINT64_MAX - (UINT64_MAX % bound);
  std::uint64_t x;
  do x = rng();
  while (x >= limit);
  return x % bound;
}

}  // namespace

DistributedSampler::DistributedSampler(const SamplerOptions& o) : options_(o) {
  if (o.dataset_size <= 0) {
    throw InvalidArgument("the data set is empty (" + std::to_string(o.dataset_size) + " samples)");
  }
  if (o.world_size < 1) {
    throw InvalidArgument("the number of replicas must be at least 1, got " + std::to_string(o.world_size));
  }
  if (o.micro_batch < 1) {
    throw InvalidArgument("the micro-batch must be at least 1, got " + std::to_string(o.micro_batch));
  }
  const bool overflows = __builtin_mul_overflow(o.micro_batch, std::int64_t{o.world_size}, &global_batch_);
  if (overflows || global_batch_ > o.dataset_size) {
    throw InvalidArgument("the global batch (" + std::to_string(o.world_size) + " replicas x " +
                          std::to_string(o.micro_batch) + " = " +
                          (overflows ? std::string("2^63 or more") : std::to_string(global_batch_)) +
                          ") is larger than the data set (" + std::to_string(o.dataset_size) +
                          " samples); lower the micro-batch or the world size (--micro-batch, --replicas).");
  }
  steps_per_epoch_ = o.dataset_size / global_batch_;
  if (o.last_batch == LastBatch::Keep && o.dataset_size % global_batch_ != 0) ++steps_per_epoch_;
}

std::vector<std::int64_t> DistributedSampler::epoch_order(std::int64_t epoch) const {
  LOCKSTEP_REQUIRE(epoch >= 0, "DistributedSampler::epoch_order: epoch " + std::to_string(epoch) +
                                   " is negative; epochs count from 0");
  std::vector<std::int64_t> order(static_cast<std::size_t>(options_.dataset_size));
  std::iota(order.begin(), order.end(), 0);
  if (!options_.shuffle) return order;
  std::mt19937_64 rng(options_.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(epoch) + 1);
  for (std::size_t i = order.size() - 1; i > 0; --i) {
    std::swap(order[i], order[uniform_below(rng, i + 1)]);
  }
  return order;
}

Shard DistributedSampler::shard(std::int64_t step, int rank) const {
  LOCKSTEP_REQUIRE(step >= 0 && step < steps_per_epoch_,
                   "DistributedSampler::shard: step " + std::to_string(step) + " is outside the epoch's steps 0.." +
                       std::to_string(steps_per_epoch_ - 1));
  LOCKSTEP_REQUIRE(rank >= 0 && rank < options_.world_size,
                   "DistributedSampler::shard: rank " + std::to_string(rank) + " is outside the group's ranks 0.." +
                       std::to_string(options_.world_size - 1));
  const std::int64_t start = step * global_batch_;
  const std::int64_t count = std::min(global_batch_, options_.dataset_size - start);
  const std::int64_t n = options_.world_size;
  // Equal shards when count == B; otherwise as even as possible, contiguous.
  // In 128 bits: count x rank would overflow 64 for counts past 2^63 / n.
  const auto cut = [&](std::int64_t r) {
    return start + static_cast<std::int64_t>(static_cast<__int128>(count) * r / n);
  };
  return {cut(rank), cut(rank + 1), count};
}

}  // namespace lockstep::ddp
