// The collective grid over the Gloo backend: every collective, every
// algorithm (ours and Gloo's native all-reduce), sum/mean/max/min, closed-form
// results and bitwise identical on every rank, at N = 2, 3, 4, 8 processes
// (the checks run inside each rank: gloo_rank_main.cpp, scenario "grid").
#include <gtest/gtest.h>

#include "gloo_group.h"
#include "temp_dir_test.h"

namespace lockstep::testing {
namespace {

class GlooGrid : public TempDirTest, public ::testing::WithParamInterface<int> {};

TEST_P(GlooGrid, EveryCollectiveMatchesTheClosedFormBitwiseOnEveryRank) {
  const int n = GetParam();
  GlooGroup group(dir_);
  group.spawn_all(n, {"--world-size", std::to_string(n), "--rendezvous", "file:" + (dir_ / "rdv").string(),
                      "--scenario", "grid", "--timeout-ms", "30000"});
  const auto exits = group.wait_all(std::chrono::seconds(55));
  for (int r = 0; r < n; ++r) EXPECT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].log;
}

INSTANTIATE_TEST_SUITE_P(Processes, GlooGrid, ::testing::Values(2, 3, 4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "_ranks"; });

}  // namespace
}  // namespace lockstep::testing
