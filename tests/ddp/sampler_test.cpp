#include "lockstep/ddp/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "lockstep/error.h"

namespace lockstep::ddp {
namespace {

struct Combo {
  std::int64_t size;
  int world;
  std::int64_t micro;
};

// Divisible and non-divisible; remainders smaller than the world size (so
// some shards of the last kept step are empty); world 1; B == size.
const Combo kCombos[] = {{100, 4, 8}, {64, 4, 16}, {10, 3, 3}, {10, 4, 2},   {1000, 8, 32},
                         {7, 1, 2},   {5, 5, 1},   {97, 3, 5}, {1003, 8, 32}};

std::string describe(const Combo& c) {
  return "size=" + std::to_string(c.size) + " world=" + std::to_string(c.world) +
         " micro=" + std::to_string(c.micro);
}

SamplerOptions options(const Combo& c, LastBatch last, bool shuffle = true, std::uint64_t seed = 5) {
  return {.dataset_size = c.size,
          .world_size = c.world,
          .micro_batch = c.micro,
          .shuffle = shuffle,
          .seed = seed,
          .last_batch = last};
}

// Checks the shards of one step: contiguous, disjoint, in rank order, and
// together exactly [s*B, s*B + global_count). Returns global_count.
std::int64_t check_step(const DistributedSampler& sampler, const Combo& c, std::int64_t step) {
  const std::int64_t B = sampler.global_batch();
  std::int64_t pos = step * B;
  const std::int64_t count = sampler.shard(step, 0).global_count;
  std::int64_t smallest = count, largest = 0;
  for (int r = 0; r < c.world; ++r) {
    const Shard s = sampler.shard(step, r);
    EXPECT_EQ(s.global_count, count) << describe(c) << " step " << step << " rank " << r;
    EXPECT_EQ(s.begin, pos) << describe(c) << " step " << step << " rank " << r << ": gap or overlap";
    EXPECT_GE(s.size(), 0);
    smallest = std::min(smallest, s.size());
    largest = std::max(largest, s.size());
    pos = s.end;
  }
  EXPECT_EQ(pos, step * B + count) << describe(c) << " step " << step << ": shards do not cover the batch";
  EXPECT_LE(largest - smallest, 1) << describe(c) << " step " << step << ": cut not as even as possible";
  return count;
}

TEST(Sampler, GlobalBatchIsWorldTimesMicroBatch) {
  for (const Combo& c : kCombos) {
    DistributedSampler s(options(c, LastBatch::Drop));
    EXPECT_EQ(s.global_batch(), c.world * c.micro) << describe(c);
  }
}

TEST(Sampler, DropGivesFullStepsOnly) {
  for (const Combo& c : kCombos) {
    DistributedSampler s(options(c, LastBatch::Drop));
    const std::int64_t B = c.world * c.micro;
    ASSERT_EQ(s.steps_per_epoch(), c.size / B) << describe(c);
    for (std::int64_t step = 0; step < s.steps_per_epoch(); ++step) {
      EXPECT_EQ(check_step(s, c, step), B) << describe(c) << " step " << step;
      for (int r = 0; r < c.world; ++r) {
        EXPECT_EQ(s.shard(step, r).size(), c.micro) << describe(c);
        EXPECT_EQ(s.shard(step, r).begin, step * B + r * c.micro) << describe(c);
      }
    }
  }
}

TEST(Sampler, KeepCoversEverySampleExactlyOnce) {
  for (const Combo& c : kCombos) {
    DistributedSampler s(options(c, LastBatch::Keep));
    const std::int64_t B = c.world * c.micro;
    ASSERT_EQ(s.steps_per_epoch(), (c.size + B - 1) / B) << describe(c);
    const auto order = s.epoch_order(3);
    std::vector<int> seen(c.size, 0);
    for (std::int64_t step = 0; step < s.steps_per_epoch(); ++step) {
      const std::int64_t count = check_step(s, c, step);
      const bool last = step == s.steps_per_epoch() - 1;
      EXPECT_EQ(count, last && c.size % B != 0 ? c.size % B : B) << describe(c) << " step " << step;
      for (int r = 0; r < c.world; ++r) {
        const Shard sh = s.shard(step, r);
        for (std::int64_t p = sh.begin; p < sh.end; ++p) ++seen[order[p]];
      }
    }
    for (std::int64_t i = 0; i < c.size; ++i) ASSERT_EQ(seen[i], 1) << describe(c) << " sample " << i;
  }
}

TEST(Sampler, EpochOrderIsAPermutation) {
  for (const Combo& c : kCombos) {
    DistributedSampler s(options(c, LastBatch::Drop));
    for (std::int64_t epoch : {0, 1, 17}) {
      auto order = s.epoch_order(epoch);
      ASSERT_EQ(order.size(), static_cast<std::size_t>(c.size));
      std::sort(order.begin(), order.end());
      for (std::int64_t i = 0; i < c.size; ++i) ASSERT_EQ(order[i], i) << describe(c) << " epoch " << epoch;
    }
  }
}

TEST(Sampler, ReplicasBuildIdenticalOrders) {
  for (const Combo& c : kCombos) {
    // Two replicas build their own sampler from the same options.
    DistributedSampler a(options(c, LastBatch::Keep)), b(options(c, LastBatch::Keep));
    for (std::int64_t epoch : {0, 1, 2, 50})
      EXPECT_EQ(a.epoch_order(epoch), b.epoch_order(epoch)) << describe(c);
    for (std::int64_t step = 0; step < a.steps_per_epoch(); ++step) {
      for (int r = 0; r < c.world; ++r) {
        EXPECT_EQ(a.shard(step, r).begin, b.shard(step, r).begin);
        EXPECT_EQ(a.shard(step, r).end, b.shard(step, r).end);
      }
    }
  }
}

TEST(Sampler, OrderDependsOnEpochAndSeed) {
  const Combo c{1000, 8, 32};
  DistributedSampler s5(options(c, LastBatch::Drop, true, 5)), s6(options(c, LastBatch::Drop, true, 6));
  const auto e0 = s5.epoch_order(0), e1 = s5.epoch_order(1);
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, s6.epoch_order(0));
  EXPECT_NE(e1, s6.epoch_order(1));
  std::vector<std::int64_t> identity(c.size);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(e0, identity);
  // Not just a rotation or a small perturbation: most positions move.
  std::int64_t same = 0;
  for (std::int64_t i = 0; i < c.size; ++i) same += e0[i] == e1[i];
  EXPECT_LT(same, c.size / 10);
}

TEST(Sampler, NoShuffleIsFileOrder) {
  for (const Combo& c : kCombos) {
    DistributedSampler s(options(c, LastBatch::Drop, /*shuffle=*/false));
    const auto order = s.epoch_order(4);
    for (std::int64_t i = 0; i < c.size; ++i) ASSERT_EQ(order[i], i) << describe(c);
    EXPECT_EQ(s.epoch_order(0), order);
    const std::int64_t B = s.global_batch(), b = c.micro;
    for (std::int64_t step = 0; step < s.steps_per_epoch(); ++step) {
      for (int r = 0; r < c.world; ++r) {
        const Shard sh = s.shard(step, r);
        ASSERT_EQ(sh.size(), b);
        // Step s, rank r takes samples s*B + r*b .. s*B + r*b + b - 1.
        EXPECT_EQ(order[sh.begin], step * B + r * b) << describe(c);
        EXPECT_EQ(order[sh.end - 1], step * B + r * b + b - 1) << describe(c);
      }
    }
  }
}

// Expects InvalidArgument whose message contains every string in `needles`.
void expect_invalid(const SamplerOptions& o, std::vector<std::string> needles) {
  try {
    DistributedSampler s(o);
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

TEST(Sampler, InvalidOptionsThrowWithTheNumbers) {
  expect_invalid({.dataset_size = 0, .world_size = 2, .micro_batch = 4}, {"empty"});
  expect_invalid({.dataset_size = 100, .world_size = 0, .micro_batch = 4}, {"0"});
  expect_invalid({.dataset_size = 100, .world_size = -3, .micro_batch = 4}, {"-3"});
  expect_invalid({.dataset_size = 100, .world_size = 2, .micro_batch = 0}, {"0"});
  expect_invalid({.dataset_size = 100, .world_size = 4, .micro_batch = 32}, {"4", "32", "128", "100"});
  expect_invalid({.dataset_size = 100, .world_size = 4, .micro_batch = 32, .last_batch = LastBatch::Keep},
                 {"128", "100"});
  expect_invalid({.dataset_size = 127, .world_size = 4, .micro_batch = 32}, {"128", "127"});  // boundary
  EXPECT_NO_THROW(DistributedSampler({.dataset_size = 128, .world_size = 4, .micro_batch = 32}));
  // A product past 2^63 is refused, not wrapped around to a small batch.
  expect_invalid({.dataset_size = std::int64_t{1} << 62, .world_size = 8, .micro_batch = std::int64_t{1} << 62},
                 {"2^63 or more"});
}

// Steps and ranks outside the sampler's are refused, and so is an epoch
// before the first (it would draw an order no epoch of the run has).
TEST(Sampler, ShardsAndOrdersOutsideTheRunAreRefused) {
  const DistributedSampler s({.dataset_size = 100, .world_size = 4, .micro_batch = 5});
  EXPECT_THROW(s.shard(-1, 0), InvalidArgument);
  EXPECT_THROW(s.shard(s.steps_per_epoch(), 0), InvalidArgument);
  EXPECT_THROW(s.shard(0, 4), InvalidArgument);
  EXPECT_THROW(s.epoch_order(-1), InvalidArgument);
  EXPECT_NO_THROW(s.epoch_order(0));
}

}  // namespace
}  // namespace lockstep::ddp
