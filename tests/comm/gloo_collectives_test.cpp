// The collective grid over the Gloo backend: every collective, every
// algorithm (ours and Gloo's native all-reduce), sum/mean/max/min, closed-form
// results and bitwise identical on every rank, at N = 2, 3, 4, 8 processes
// (the checks run inside each rank: gloo_rank_main.cpp, scenario "grid").
#include <gtest/gtest.h>

#include "gloo_group.h"
#include "temp_dir_test.h"

namespace lockstep::testing {
namespace {

// (world size, all-reduce algorithm or "others": the other collectives)
class GlooGrid : public TempDirTest, public ::testing::WithParamInterface<std::tuple<int, std::string>> {};

TEST_P(GlooGrid, MatchesTheClosedFormBitwiseOnEveryRank) {
  const auto [n, algorithm] = GetParam();
  GlooGroup group(dir_);
  group.spawn_all(n, {"--world-size", std::to_string(n), "--rendezvous", "file:" + (dir_ / "rdv").string(),
                      "--scenario", "grid", "--algorithm", algorithm, "--timeout-ms", "30000"});
  const auto exits = group.wait_all(std::chrono::seconds(90));  // a hang guard; seconds on an idle machine
  for (int r = 0; r < n; ++r) EXPECT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].log;
}

INSTANTIATE_TEST_SUITE_P(Processes, GlooGrid,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8),
                                            ::testing::Values("ring", "naive", "halving_doubling", "native",
                                                              "auto", "others")),
                         [](const auto& info) {
                           std::string name = std::get<1>(info.param);
                           name += "_";
                           name += std::to_string(std::get<0>(info.param));
                           return name + "_ranks";
                         });

}  // namespace
}  // namespace lockstep::testing
