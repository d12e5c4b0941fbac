// The all-reduce cost formulas against hand-computed values.
#include "lockstep/cost/collective_cost.h"

#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/cost/profile.h"
#include "lockstep/error.h"

namespace lockstep::cost {
namespace {

// A flat network: 1 GB/s (1 ns per byte), 10 us per message.
Topology flat() {
  return {.per_node = 1, .inter = {1e9, 10e-6}};
}

TEST(CollectiveCost, RingBytesAndTermsMatchTheClosedForm) {
  for (int n = 2; n <= 9; ++n) {
    for (double p : {1.0, 1000.0, double(1 << 20), 102.4e6}) {
      const CollectiveCost c = allreduce_cost(p, n, flat(), Algorithm::Ring);
      EXPECT_EQ(c.algorithm, Algorithm::Ring);
      EXPECT_NEAR(c.bytes_sent, 2 * p * (n - 1) / n, 1e-9 * p);
      EXPECT_EQ(c.rounds, 2 * (n - 1));
      EXPECT_NEAR(c.alpha_s, 2 * (n - 1) * 10e-6, 1e-15);
      EXPECT_NEAR(c.beta_s, 2 * p * (n - 1) / n * 1e-9, 1e-12 * p);
      EXPECT_DOUBLE_EQ(c.gamma_s, 0);
      EXPECT_DOUBLE_EQ(c.seconds, c.alpha_s + c.beta_s);
    }
  }
}

TEST(CollectiveCost, HalvingDoublingAlphaIsTwoLog2PPlusTwoForTheFold) {
  const double p = 1 << 20;
  const std::pair<int, int> cases[] = {{2, 2}, {3, 4}, {4, 4}, {5, 6}, {7, 6}, {8, 6}, {9, 8}, {16, 8}};
  for (auto [n, rounds] : cases) {
    const CollectiveCost c = allreduce_cost(p, n, flat(), Algorithm::HalvingDoubling);
    EXPECT_EQ(c.rounds, rounds) << n;
    EXPECT_NEAR(c.alpha_s, rounds * 10e-6, 1e-15) << n;
  }
  // N = 8: 2P(p-1)/p bytes. N = 6 (p = 4, one fold): 2P(3/4) + 2P.
  EXPECT_NEAR(allreduce_cost(p, 8, flat(), Algorithm::HalvingDoubling).bytes_sent, 2 * p * 7 / 8, 1e-6);
  EXPECT_NEAR(allreduce_cost(p, 6, flat(), Algorithm::HalvingDoubling).beta_s, (2 * p * 3 / 4 + 2 * p) * 1e-9,
              1e-12);
}

TEST(CollectiveCost, TreeHasLogDepthLatencyAndTwoPBandwidth) {
  const double p = 1e6;
  for (int n : {2, 3, 8, 9, 64}) {
    const CollectiveCost c = allreduce_cost(p, n, flat(), Algorithm::Tree);
    EXPECT_NEAR(c.alpha_s, 2 * std::ceil(std::log2(n)) * 10e-6, 1e-15) << n;
    EXPECT_NEAR(c.beta_s, 2 * p * 1e-9, 1e-12) << n;
  }
}

TEST(CollectiveCost, HierarchicalHandComputed) {
  // 4 nodes x 8: intra 100 GB/s 5 us, inter 10 GB/s 20 us, P = 80 MB.
  const Topology t{.per_node = 8, .intra = {100e9, 5e-6}, .inter = {10e9, 20e-6}};
  const double p = 80e6;
  const CollectiveCost c = allreduce_cost(p, 32, t, Algorithm::Hierarchical);
  // 2(G-1)(a_i + P/G b_i) + 2(M-1)(a_e + P/M b_e)
  const double expected = 2 * 7 * (5e-6 + 10e6 / 100e9) + 2 * 3 * (20e-6 + 20e6 / 10e9);
  EXPECT_NEAR(c.seconds, expected, 1e-12);
  EXPECT_EQ(c.rounds, 2 * 7 + 2 * 3);
}

// Halving-doubling placed as the algorithm places it. 3 replicas, 2 per
// node: the fold (1 -> 0) stays in node 0, and then virtual ranks 0 and 1
// are real ranks 0 and 2, on two nodes, so both exchanges of P/2 cross. The
// model charged them as inside a node (distance 1 < G) and priced 400 MB
// between two nodes at 10 Gbit/s in 102 ms.
TEST(CollectiveCost, HalvingDoublingCrossesNodesWhereTheFoldPutsThePairs) {
  const Topology t{.per_node = 2, .intra = {100e9, 5e-6}, .inter = {1.25e9, 50e-6}};
  const double p = 400e6;
  const CollectiveCost c = allreduce_cost(p, 3, t, Algorithm::HalvingDoubling);
  EXPECT_NEAR(c.alpha_s, 2 * 5e-6 + 2 * 50e-6, 1e-15);
  EXPECT_NEAR(c.beta_s, 2 * p / 100e9 + 2 * (p / 2) / 1.25e9, 1e-12);
  // 8 replicas, 4 per node: distance 4 crosses with all 4 of a node's
  // replicas on its link, distances 2 and 1 stay inside (the closed form).
  const Topology four{.per_node = 4, .intra = {100e9, 5e-6}, .inter = {1.25e9, 50e-6}};
  const CollectiveCost e = allreduce_cost(p, 8, four, Algorithm::HalvingDoubling);
  EXPECT_NEAR(e.beta_s, 2 * (p / 2) * 4 / 1.25e9 + 2 * (p / 4 + p / 8) / 100e9, 1e-12);
  // 6 per node is not a power of two: ranks 0..5 and 6..11 (12 replicas,
  // p = 8, 4 folded, all inside nodes). Virtual ranks 0..7 are real 0, 2, 4,
  // 6, 8, 9, 10, 11. Distance 4: 3 of each node's 4 leave it; distance 2
  // (2 <-> 6) and distance 1 (4 <-> 6): one each, which "d >= G" never
  // counted.
  const Topology six{.per_node = 6, .intra = {100e9, 5e-6}, .inter = {1.25e9, 50e-6}};
  const CollectiveCost f = allreduce_cost(p, 12, six, Algorithm::HalvingDoubling);
  EXPECT_NEAR(f.beta_s, 2 * p / 100e9 + 2 * (3 * p / 2 + p / 4 + p / 8) / 1.25e9, 1e-12);
  // The placement passed in gives the same, and one for another group is not used.
  const auto placed = halving_doubling_placement(12, 6);
  EXPECT_EQ(allreduce_cost(p, 12, six, Algorithm::HalvingDoubling, 0, &placed).beta_s, f.beta_s);
  const auto other = halving_doubling_placement(16, 4);
  EXPECT_EQ(allreduce_cost(p, 12, six, Algorithm::HalvingDoubling, 0, &other).beta_s, f.beta_s);
}

TEST(CollectiveCost, FlatRingAcrossNodesRunsAtTheNicsPace) {
  // 2 nodes x 4: every round one message per node crosses the slow link.
  const Topology t{.per_node = 4, .intra = {100e9, 1e-6}, .inter = {1e9, 10e-6}};
  const CollectiveCost c = allreduce_cost(8e6, 8, t, Algorithm::Ring);
  EXPECT_NEAR(c.seconds, 14 * (10e-6 + 1e6 / 1e9), 1e-12);
  // Inside one node only the fast link is used.
  EXPECT_NEAR(allreduce_cost(8e6, 4, t, Algorithm::Ring).seconds, 6 * (1e-6 + 2e6 / 100e9), 1e-12);
}

TEST(CollectiveCost, BestIsNeverWorseAndAutoFollowsTheTrainer) {
  const Topology t{.per_node = 4, .intra = {50e9, 3e-6}, .inter = {3e9, 15e-6}};
  for (int n : {2, 5, 8, 16, 100})
    for (double p : {4e3, 1e6, 1e8}) {
      const double best = allreduce_cost(p, n, t, Algorithm::Best).seconds;
      for (Algorithm a :
           {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree, Algorithm::Hierarchical})
        EXPECT_LE(best, allreduce_cost(p, n, t, a).seconds * (1 + 1e-12));
    }
  EXPECT_EQ(allreduce_cost(1000, 8, flat(), Algorithm::Auto).algorithm, Algorithm::HalvingDoubling);
  EXPECT_EQ(allreduce_cost(1 << 20, 8, flat(), Algorithm::Auto).algorithm, Algorithm::Ring);
  // Several nodes of equal size: the hierarchical all-reduce, as comm::Algorithm::Auto.
  EXPECT_EQ(allreduce_cost(1 << 20, 8, t, Algorithm::Auto).algorithm, Algorithm::Hierarchical);
  EXPECT_EQ(allreduce_cost(1000, 8, t, Algorithm::Auto).algorithm, Algorithm::HalvingDoubling);
  EXPECT_EQ(allreduce_cost(1 << 20, 6, t, Algorithm::Auto).algorithm, Algorithm::Ring);  // nodes of 4 and 2
  EXPECT_EQ(allreduce_cost(1 << 20, 4, t, Algorithm::Auto).algorithm, Algorithm::Ring);  // one node
}

TEST(CollectiveCost, OneReplicaOrNoBytesCostsNothing) {
  EXPECT_DOUBLE_EQ(allreduce_cost(1e9, 1, flat(), Algorithm::Best).seconds, 0);
  EXPECT_DOUBLE_EQ(allreduce_cost(0, 8, flat(), Algorithm::Ring).seconds, 0);
}

TEST(CollectiveCost, GammaChargesTheReduction) {
  const CollectiveCost c = allreduce_cost(1e6, 4, flat(), Algorithm::Ring, 1e9);
  EXPECT_NEAR(c.gamma_s, 1e6 * 3 / 4 * 1e-9, 1e-15);
}

TEST(CollectiveCost, MoreBandwidthIsNeverSlower) {
  for (Algorithm a : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree, Algorithm::Hierarchical,
                      Algorithm::Best}) {
    double last = INFINITY;
    for (double bw = 1e8; bw <= 1e12; bw *= 3) {
      const Topology t{.per_node = 4, .intra = {bw * 4, 2e-6}, .inter = {bw, 20e-6}};
      const double s = allreduce_cost(5e7, 64, t, a).seconds;
      EXPECT_LE(s, last) << to_string(a) << " at " << bw;
      last = s;
    }
  }
}

TEST(CollectiveCost, BadInputsAreRejectedWithAMessage) {
  Topology bad = flat();
  bad.inter.bytes_per_second = 0;
  EXPECT_THROW(allreduce_cost(1, 2, bad, Algorithm::Ring), InvalidArgument);
  EXPECT_THROW(allreduce_cost(1, 0, flat(), Algorithm::Ring), InvalidArgument);
  EXPECT_THROW(allreduce_cost(-1, 2, flat(), Algorithm::Ring), InvalidArgument);
  try {
    algorithm_from_string("rign");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("halving_doubling"), std::string::npos);
  }
}

// Inputs past what the model prices are refused, not looped over for minutes
// (2^30 replicas) or priced as nonsense (a negative compute factor).
TEST(CollectiveCost, ImpossibleInputsAreRefused) {
  EXPECT_THROW(halving_doubling_placement(0, 0), InvalidArgument);
  EXPECT_THROW(halving_doubling_placement(kMaxModelledReplicas + 1, 1), InvalidArgument);
  EXPECT_THROW(allreduce_cost(1e6, 1 << 30, Topology{}, Algorithm::Ring), InvalidArgument);
  Profile p{.model = "m", .micro_batch = 1, .step_compute_ms = 1};
  p.layers.push_back({"0", 4, 0.3, 0.6});
  EXPECT_THROW(scale_compute(p, -1), InvalidArgument);
  EXPECT_NO_THROW(scale_compute(p, 2));
}

}  // namespace
}  // namespace lockstep::cost
