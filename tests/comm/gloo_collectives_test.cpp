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
class GlooGroupTest : public TempDirTest {};

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

// Ranks bound to one loopback address per "node" (127.0.0.1, .2, ...): the
// communicator reports those nodes, and the hierarchical all-reduce (which
// Auto then picks above 64 KiB) matches the closed form on every rank.
// Duration::max() as the timeout after connect (set_timeout takes any
// Duration): Gloo adds its waits' timeouts to the clock, so GlooWork::wait
// and the native all-reduce hold them to 30 days instead of overflowing.
TEST_F(GlooGroupTest, TheLongestTimeoutAfterConnectWaitsForALateRank) {
  GlooGroup group(dir_);
  group.spawn_all(2, {"--world-size", "2", "--rendezvous", "file:" + (dir_ / "rdv").string(), "--scenario",
                      "longest", "--timeout-ms", "30000"});
  const auto exits = group.wait_all(std::chrono::seconds(60));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].log;
}

class GlooNodes : public TempDirTest,
                  public ::testing::WithParamInterface<std::tuple<int, int, std::string>> {};

TEST_P(GlooNodes, HierarchicalMatchesTheClosedFormBitwiseOnEveryRank) {
  const auto [n, per_node, algorithm] = GetParam();
  GlooGroup group(dir_);
  group.spawn_all(n, {"--world-size", std::to_string(n), "--rendezvous", "file:" + (dir_ / "rdv").string(),
                      "--scenario", "grid", "--algorithm", algorithm, "--per-node", std::to_string(per_node),
                      "--timeout-ms", "30000"});
  const auto exits = group.wait_all(std::chrono::seconds(90));
  for (int r = 0; r < n; ++r) EXPECT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].log;
}

INSTANTIATE_TEST_SUITE_P(Processes, GlooNodes,
                         ::testing::Values(std::tuple{4, 2, "hierarchical"}, std::tuple{6, 3, "hierarchical"},
                                           std::tuple{8, 2, "hierarchical"}, std::tuple{4, 2, "auto"}),
                         [](const auto& info) {
                           return std::get<2>(info.param) + "_" + std::to_string(std::get<0>(info.param)) +
                                  "_ranks_" + std::to_string(std::get<1>(info.param)) + "_per_node";
                         });

}  // namespace
}  // namespace lockstep::testing
