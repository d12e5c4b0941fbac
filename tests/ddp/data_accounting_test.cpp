// Exactly-once accounting, as a pure function over per-rank tallies.
#include "lockstep/ddp/data_accounting.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

namespace lockstep::ddp {
namespace {

// Rank r reads `per_rank` indices starting at first + r * per_rank (or `start` for every rank).
std::vector<SampleTally> shards(int ranks, std::int64_t per_rank, std::function<std::int64_t(int)> start) {
  std::vector<SampleTally> t(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    for (std::int64_t i = 0; i < per_rank; ++i) t[r].add(start(r) + i);
  return t;
}

SampleTally plan(std::int64_t first, std::int64_t count) {
  SampleTally p;
  for (std::int64_t i = 0; i < count; ++i) p.add(first + i);
  return p;
}

TEST(DataAccounting, DisjointShardsOfThePlanPassInAnyOrder) {
  const auto t = shards(8, 32, [](int r) { return 1000 + 32 * r; });
  EXPECT_EQ(audit_samples(t, plan(1000, 256)), std::nullopt);
  // Another cut of the same samples between ranks (ragged) passes too.
  std::vector<SampleTally> ragged(3);
  for (std::int64_t i = 0; i < 256; ++i) ragged[i % 3].add(1000 + 255 - i);
  EXPECT_EQ(audit_samples(ragged, plan(1000, 256)), std::nullopt);
}

TEST(DataAccounting, SameSeedBugNamesTheRanksThatReadIdenticalSamples) {
  const auto t = shards(8, 32, [](int) { return 1000; });  // everyone reads rank 0's shard
  const auto problem = audit_samples(t, plan(1000, 256));
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("ranks 0, 1, 2, 3, 4, 5, 6 and 7 read identical samples"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("same-seed bug"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("256 samples read, 256 planned"), std::string::npos) << *problem;
}

TEST(DataAccounting, OverlapMissAndSwapAreEachNamed) {
  auto overlap = shards(4, 32, [](int r) { return 16 * r; });  // shards overlap by half
  auto p = audit_samples(overlap, plan(0, 80));
  ASSERT_TRUE(p);
  EXPECT_NE(p->find("read by more than one replica"), std::string::npos) << *p;

  auto missing = shards(4, 32, [](int r) { return 32 * r; });
  p = audit_samples(missing, plan(0, 160));
  ASSERT_TRUE(p);
  EXPECT_NE(p->find("read by no replica"), std::string::npos) << *p;

  auto swapped = shards(4, 32, [](int r) { return 32 * r; });
  swapped[3] = {};
  for (std::int64_t i = 0; i < 32; ++i) swapped[3].add(i == 0 ? 5 : 96 + i);  // 96 missed, 5 read twice
  p = audit_samples(swapped, plan(0, 128));
  ASSERT_TRUE(p);
  EXPECT_NE(p->find("not the planned ones"), std::string::npos) << *p;
}

TEST(DataAccounting, TallyIsOrderIndependentAndCountsEverySample) {
  SampleTally a, b;
  for (std::int64_t i = 0; i < 100; ++i) a.add(i);
  for (std::int64_t i = 100; i-- > 0;) b.add(i);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.count, 100u);
  b.add(7);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace lockstep::ddp
