// The step model: hand-computed timelines, fully hidden and fully exposed
// cases, and the monotonicity the model must have.
#include "lockstep/cost/step_cost.h"

#include <gtest/gtest.h>

#include <functional>

#include <cmath>
#include <numbers>

#include "lockstep/cost/models.h"
#include "lockstep/error.h"

namespace lockstep::cost {
namespace {

constexpr double kMiB = 1 << 20;

// A flat 1 GB/s link with no latency: an all-reduce of P over 2 replicas
// (ring) takes exactly P/1e9 seconds.
StepOptions two_replicas() {
  return {.replicas = 2, .micro_batch = 1, .topology = {.inter = {1e9, 0}}, .algorithm = Algorithm::Ring};
}

Profile two_layers(double first_bytes, double first_bwd_ms, double last_bytes, double last_bwd_ms) {
  return {.model = "two layers",
          .layers = {{"first", first_bytes, 1.0, first_bwd_ms}, {"last", last_bytes, 1.0, last_bwd_ms}},
          .micro_batch = 1,
          .step_compute_ms = 2 + first_bwd_ms + last_bwd_ms + 0.5};
}

TEST(StepCost, HandComputedTimeline) {
  // Backward: last (2 ms) then first (3 ms). The last layer's 4 MiB (bucket 0,
  // closes at the 1 MiB first-bucket cap) is ready at 2 + 2 = 4 ms and takes
  // 4.194 ms; the first layer's 8 MiB (bucket 1) is ready at 7 ms and starts
  // when the stream frees at 8.194 ms, ending at 16.583 ms. Backward ends at 7 ms.
  const Profile p = two_layers(8 * kMiB, 3, 4 * kMiB, 2);
  const StepPrediction s = predict_step(p, two_replicas());
  ASSERT_EQ(s.buckets.size(), 2u);
  EXPECT_NEAR(s.buckets[0].ready_ms, 4, 1e-9);
  EXPECT_NEAR(s.buckets[0].end_ms, 4 + 4 * kMiB / 1e6, 1e-9);
  EXPECT_NEAR(s.buckets[1].ready_ms, 7, 1e-9);
  EXPECT_NEAR(s.buckets[1].start_ms, s.buckets[0].end_ms, 1e-9);
  EXPECT_NEAR(s.comm_ms, 12 * kMiB / 1e6, 1e-9);
  EXPECT_NEAR(s.exposed_comm_ms, 4 + 12 * kMiB / 1e6 - 7, 1e-9);
  EXPECT_NEAR(s.compute_ms, 7.5, 1e-9);
  EXPECT_NEAR(s.step_ms, s.compute_ms + s.exposed_comm_ms, 1e-9);
  EXPECT_NEAR(s.gradient_bytes, 12 * kMiB, 1e-6);
}

TEST(StepCost, FullyHidden) {
  // A big last layer ready first, and a long backward of a tiny first layer:
  // 4 MiB takes 4.19 ms, the first layer's backward 10 ms; only the tiny
  // bucket's 1 KB (1 us) sticks out.
  const Profile p = two_layers(1000, 10, 4 * kMiB, 1);
  const StepPrediction s = predict_step(p, two_replicas());
  EXPECT_NEAR(s.exposed_comm_ms, 1000 / 1e6, 1e-9);
  EXPECT_NEAR(s.step_ms, s.compute_ms + 0.001, 1e-9);
}

TEST(StepCost, FullyExposedWithOneBucket) {
  StepOptions o = two_replicas();
  o.bucket_mb = 0;
  const Profile p = two_layers(8 * kMiB, 3, 4 * kMiB, 2);
  const StepPrediction s = predict_step(p, o);
  ASSERT_EQ(s.buckets.size(), 1u);
  EXPECT_NEAR(s.exposed_comm_ms, s.comm_ms, 1e-9);
  EXPECT_NEAR(s.step_ms, s.compute_ms + 12 * kMiB / 1e6, 1e-9);
}

// ZeRO-1 as lockstep trains it: the hand-computed timeline above with each
// all-reduce cut in its halves. Bucket 0's reduce-scatter (half of 4 MiB's
// all-reduce over 2 replicas: 2.097 ms) runs from 4 ms; bucket 1's (4.194
// ms) starts at its ready time, 7 ms (the stream is free from 6.097 ms),
// and ends at 11.194 ms. Then the optimizer on half the parameters (0.25 of
// 0.5 ms), then both all-gathers (6.291 ms), exposed.
TEST(StepCost, ZeroOneReduceScattersInBackwardAndGathersAfterTheOptimizer) {
  const Profile p = two_layers(8 * kMiB, 3, 4 * kMiB, 2);
  StepOptions o = two_replicas();
  o.zero1 = true;
  const StepPrediction s = predict_step(p, o);
  ASSERT_EQ(s.buckets.size(), 2u);
  EXPECT_NEAR(s.buckets[0].end_ms, 4 + 2 * kMiB / 1e6, 1e-9);
  EXPECT_NEAR(s.buckets[1].start_ms, 7, 1e-9);
  EXPECT_NEAR(s.buckets[1].end_ms, 7 + 4 * kMiB / 1e6, 1e-9);
  EXPECT_NEAR(s.optimizer_ms, 0.25, 1e-9);
  EXPECT_NEAR(s.gather_ms, 6 * kMiB / 1e6, 1e-9);
  EXPECT_NEAR(s.comm_ms, 12 * kMiB / 1e6, 1e-9);  // the all-reduce's time, in two halves
  EXPECT_NEAR(s.bytes_sent, predict_step(p, two_replicas()).bytes_sent, 1e-6);
  EXPECT_NEAR(s.exposed_comm_ms, 4 * kMiB / 1e6 + 6 * kMiB / 1e6, 1e-9);
  EXPECT_NEAR(s.step_ms, 7.25 + s.exposed_comm_ms, 1e-9);
  // An optimizer of 5 passes over memory still zeroes the other half of the
  // gradients: 1/2 + 1/2 x 1/5 of its time.
  StepOptions passes = o;
  passes.optimizer_passes = 5;
  EXPECT_NEAR(predict_step(p, passes).optimizer_ms, 0.5 * 0.6, 1e-9);
  // Fully exposed (one bucket after backward): the halves add up to the
  // all-reduce, and only the optimizer's saving is left.
  o.bucket_mb = 0;
  StepOptions dp = two_replicas();
  dp.bucket_mb = 0;
  EXPECT_NEAR(predict_step(p, o).step_ms, predict_step(p, dp).step_ms - 0.25, 1e-9);
  // Not with another schedule or with bf16, which lockstep does not train that way.
  o.bf16 = true;
  EXPECT_THROW(predict_step(p, o), InvalidArgument);
}

TEST(StepCost, OneReplicaNeverCommunicates) {
  StepOptions o = two_replicas();
  o.replicas = 1;
  const StepPrediction s = predict_step(two_layers(8 * kMiB, 3, 4 * kMiB, 2), o);
  EXPECT_DOUBLE_EQ(s.comm_ms, 0);
  EXPECT_DOUBLE_EQ(s.step_ms, s.compute_ms);
}

TEST(StepCost, Bf16HalvesTheBytes) {
  StepOptions o = two_replicas();
  const Profile p = two_layers(8 * kMiB, 3, 4 * kMiB, 2);
  const double full = predict_step(p, o).comm_ms;
  o.bf16 = true;
  EXPECT_NEAR(predict_step(p, o).comm_ms, full / 2, 1e-9);
}

Profile mlp_on_cpu(std::int64_t micro_batch) {
  return profile_from_spec(mlp_model(784, {512, 512}, 10), device_preset("cpu"), micro_batch, 5);
}

TEST(StepCost, MoreBandwidthNeverSlowsAStep) {
  for (int n : {2, 3, 8, 33})
    for (double bucket : {0.0, 1.0, 25.0}) {
      double last = INFINITY;
      for (double bw = 1e7; bw < 1e12; bw *= 2) {
        StepOptions o{
            .replicas = n, .micro_batch = 32, .topology = {.inter = {bw, 50e-6}}, .bucket_mb = bucket};
        const double step = predict_step(mlp_on_cpu(32), o).step_ms;
        EXPECT_LE(step, last * (1 + 1e-12)) << n << " replicas, " << bw << " B/s";
        last = step;
      }
    }
}

TEST(StepCost, MoreComputePerStepRaisesEfficiency) {
  const Profile p = mlp_on_cpu(32);
  StepOptions o{.replicas = 8, .topology = {.inter = {1.25e9, 50e-6}}};
  double last = 0;
  for (std::int64_t b : {1, 4, 16, 64, 256, 1024}) {
    o.micro_batch = b;
    StepOptions one = o;
    one.replicas = 1;
    const double efficiency = predict_step(p, one).step_ms / predict_step(p, o).step_ms;
    EXPECT_GE(efficiency, last - 1e-12) << b;
    last = efficiency;
  }
  EXPECT_GT(last, 0.8);
}

TEST(StepCost, CommunicationDoesNotDependOnTheMicroBatch) {
  const Profile p = mlp_on_cpu(32);
  StepOptions o{.replicas = 8, .topology = {.inter = {1.25e9, 50e-6}}};
  o.micro_batch = 8;
  const StepPrediction small = predict_step(p, o);
  o.micro_batch = 512;
  const StepPrediction large = predict_step(p, o);
  EXPECT_DOUBLE_EQ(small.comm_ms, large.comm_ms);
  EXPECT_DOUBLE_EQ(small.bytes_sent, large.bytes_sent);
  EXPECT_NEAR(large.forward_ms, 64 * small.forward_ms, 1e-9);
}

TEST(StepCost, AccumulationCommunicatesOncePerStep) {
  const Profile p = mlp_on_cpu(32);
  StepOptions o{.replicas = 8, .micro_batch = 32, .topology = {.inter = {1.25e9, 50e-6}}};
  const StepPrediction one = predict_step(p, o);
  o.accumulate = 4;
  const StepPrediction four = predict_step(p, o);
  EXPECT_DOUBLE_EQ(four.comm_ms, one.comm_ms);
  EXPECT_NEAR(four.forward_ms, 4 * one.forward_ms, 1e-9);
  EXPECT_NEAR(four.exposed_comm_ms, one.exposed_comm_ms, 1e-9);  // overlap only in the last backward
}

TEST(StepCost, CoreSharing) {
  EXPECT_EQ(core_sharing(8, 2), 4);
  EXPECT_EQ(core_sharing(3, 2), 1.5);
  EXPECT_EQ(core_sharing(2, 2), 1);
  EXPECT_EQ(core_sharing(1, 2), 1);
  EXPECT_EQ(core_sharing(8, 0), 1);  // a device per replica
}

TEST(StepCost, ReplicasSharingCoresTakeTurns) {
  // 4 replicas on 2 cores: f = 2. One replica computes forward 2 + backward
  // 5 = 7 ms, so the last one starts 7 ms late: its last layer's 4 MiB is
  // ready at 7 + 2 + 2 = 11 ms and its first layer's 8 MiB at 14 ms. The ring
  // over 4 at 1 GB/s: 6 rounds of P/4, 6.29 ms and 12.58 ms. The optimizers
  // of all 4 (0.5 ms each) take 1 ms on 2 cores.
  StepOptions o = two_replicas();
  o.replicas = 4;
  o.host_cores = 2;
  const Profile p = two_layers(8 * kMiB, 3, 4 * kMiB, 2);
  const StepPrediction s = predict_step(p, o);
  ASSERT_EQ(s.buckets.size(), 2u);
  EXPECT_EQ(s.sharing, 2);
  EXPECT_NEAR(s.buckets[0].ready_ms, 11, 1e-9);
  EXPECT_NEAR(s.buckets[0].end_ms, 11 + 6 * kMiB / 1e6, 1e-9);
  EXPECT_NEAR(s.buckets[1].ready_ms, 14, 1e-9);
  EXPECT_NEAR(s.buckets[1].end_ms, 11 + 18 * kMiB / 1e6, 1e-9);
  EXPECT_NEAR(s.compute_ms, 2 * 7 + 2 * 0.5, 1e-9);
  EXPECT_NEAR(s.exposed_comm_ms, 11 + 18 * kMiB / 1e6 - 14, 1e-9);
  EXPECT_NEAR(s.step_ms, s.compute_ms + s.exposed_comm_ms, 1e-9);

  // As many cores as replicas: nobody waits, as without host_cores.
  o.host_cores = 4;
  StepOptions own = two_replicas();
  own.replicas = 4;
  EXPECT_NEAR(predict_step(p, o).step_ms, predict_step(p, own).step_ms, 1e-12);
}

TEST(StepCost, HostLatencyIsPaidEveryRoundAndEveryTurn) {
  // Ring over 4: 6 rounds per bucket, 2 buckets. 10 us per hand-off, times
  // f = 2 when 4 replicas share 2 cores.
  StepOptions o = two_replicas();
  o.replicas = 4;
  o.bucket_mb = 0;
  const Profile p = two_layers(8 * kMiB, 3, 4 * kMiB, 2);
  const double base = predict_step(p, o).comm_ms;
  o.host_latency_s = 10e-6;
  EXPECT_NEAR(predict_step(p, o).comm_ms - base, 6 * 0.010, 1e-9);
  o.host_cores = 2;
  const StepPrediction shared = predict_step(p, o);
  EXPECT_NEAR(shared.comm_ms - base, 6 * 2 * 0.010, 1e-9);
  EXPECT_NEAR(shared.alpha_ms, 6 * 2 * 0.010, 1e-9);
}

TEST(StepCost, BestChoosesWithTheHostsTerms) {
  // 6 replicas on 2 cores (f = 3), 100 Gbit/s at 5 us, one 1 MiB bucket,
  // 19 us per hand-off: on the link alone the ring (10 rounds) is cheapest,
  // but with f x 19 us per round the tree's fewer rounds win.
  const Profile p = two_layers(1 << 20, 3, 0, 0);
  StepOptions o{.replicas = 6, .micro_batch = 1, .topology = {.inter = {12.5e9, 5e-6}}, .bucket_mb = 0,
                .reduce_bytes_per_s = 1e12};
  o.algorithm = Algorithm::Best;
  EXPECT_EQ(predict_step(p, o).algorithm, Algorithm::Ring);
  o.host_cores = 2;
  o.host_latency_s = 19e-6;
  const StepPrediction best = predict_step(p, o);
  for (Algorithm a : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree, Algorithm::Hierarchical}) {
    StepOptions one = o;
    one.algorithm = a;
    EXPECT_LE(best.comm_ms, predict_step(p, one).comm_ms * (1 + 1e-12)) << to_string(a);
  }
  EXPECT_NE(best.algorithm, Algorithm::Ring);
}

TEST(StepCost, SharedCoresBoundTheReductions) {
  // 8 replicas on 2 cores, one bucket, a free link: the ring's reductions
  // (gamma = P(N-1)/N / rate) of all 8 must run on 2 cores, f = 4 x gamma.
  StepOptions o = two_replicas();
  o.replicas = 8;
  o.bucket_mb = 0;
  o.topology.inter = {1e15, 0};
  o.reduce_bytes_per_s = 1e9;
  const Profile p = two_layers(8 * kMiB, 3, 4 * kMiB, 2);
  const double gamma_ms = 12 * kMiB * 7 / 8 / 1e9 * 1e3;
  EXPECT_NEAR(predict_step(p, o).gamma_ms, gamma_ms, 1e-6);
  o.host_cores = 2;
  const StepPrediction shared = predict_step(p, o);
  EXPECT_NEAR(shared.comm_ms, 4 * gamma_ms, 1e-9);  // the bound, not alpha + beta + gamma
  EXPECT_NEAR(shared.alpha_ms + shared.beta_ms + shared.gamma_ms, shared.comm_ms, 1e-9);
}

TEST(StepCost, PerLayerLaunchesEachLayerWhenItIsReady) {
  // Backward: last (2 ms, ready at 4 ms) then first (3 ms, ready at 7 ms).
  // Each is its own all-reduce, even the 4 KiB one the 1 MiB first bucket would hold.
  StepOptions o = two_replicas();
  o.launch = StepOptions::Launch::PerLayer;
  const Profile p = two_layers(8 * kMiB, 3, 4096, 2);
  const StepPrediction s = predict_step(p, o);
  ASSERT_EQ(s.buckets.size(), 2u);
  EXPECT_NEAR(s.buckets[0].bytes, 4096, 1e-9);
  EXPECT_NEAR(s.buckets[0].start_ms, 4, 1e-9);
  EXPECT_NEAR(s.buckets[1].start_ms, 7, 1e-9);
  EXPECT_NEAR(s.exposed_comm_ms, 8 * kMiB / 1e6, 1e-9);
  EXPECT_EQ(s.negotiation_ms, 0);

  // A 4 MiB last layer is still on the wire (4-8.19 ms) when the first is
  // ready at 7: it waits its turn on the one stream.
  const StepPrediction queued = predict_step(two_layers(8 * kMiB, 3, 4 * kMiB, 2), o);
  ASSERT_EQ(queued.buckets.size(), 2u);
  EXPECT_NEAR(queued.buckets[1].start_ms, queued.buckets[0].end_ms, 1e-9);
  EXPECT_NEAR(queued.buckets[0].end_ms, 4 + 4 * kMiB / 1e6, 1e-9);
}

TEST(StepCost, CyclesReachASteadyStateAcrossSteps) {
  // 1 MB layers (1 ms each on the link), ready 4 ms (last) and 6 ms (first)
  // into a 6.5 ms step; a 4 ms cycle on the thread's own clock, which runs
  // across steps. Step 0 starts with a cycle: the cycle at 4 finds only the
  // last layer (4-5 ms), the one at 8 the first (8-9): exposed 3, the next
  // step starts at 9.5. From there the steps alternate:
  // - one starting at 9.5: nothing at the cycle at 12, both at 16, fused
  //   (16-18): exposed 2.5, step 9;
  // - one starting at 18.5: only the last at 24 (24-25), the first at 28
  //   (28-29): exposed 4.5, step 11.
  // The mean over the measured steps is a 10 ms step, 3.5 ms exposed; the
  // last step (an odd one) fuses both.
  StepOptions o = two_replicas();
  o.launch = StepOptions::Launch::Cycles;
  o.cycle_ms = 4;
  const Profile p = two_layers(1e6, 2, 1e6, 2);
  const StepPrediction s = predict_step(p, o);
  EXPECT_NEAR(s.exposed_comm_ms, 3.5, 1e-9);
  EXPECT_NEAR(s.step_ms, 10, 1e-9);
  EXPECT_NEAR(s.comm_ms, 2, 1e-9);  // per step, fused or not: 2 MB
  ASSERT_EQ(s.buckets.size(), 1u);
  EXPECT_NEAR(s.buckets[0].bytes, 2e6, 1e-9);
  EXPECT_NEAR(s.buckets[0].ready_ms, 6, 1e-9);
  EXPECT_NEAR(s.buckets[0].start_ms, 16 - 9.5, 1e-9);
  EXPECT_EQ(s.negotiation_ms, 0);  // no latency on this link

  // A 100 ms cycle: every step waits for its cycle, so a step takes a cycle.
  // Both layers are ready in it: one fused all-reduce, or, under a 1 MB
  // fusion cap, two back to back.
  o.cycle_ms = 100;
  const StepPrediction fused = predict_step(p, o);
  EXPECT_NEAR(fused.step_ms, 100, 1e-9);
  ASSERT_EQ(fused.buckets.size(), 1u);
  o.bucket_mb = 1e6 / kMiB;
  const StepPrediction capped = predict_step(p, o);
  ASSERT_EQ(capped.buckets.size(), 2u);
  EXPECT_NEAR(capped.buckets[1].start_ms, capped.buckets[0].end_ms, 1e-9);
  EXPECT_NEAR(capped.step_ms, 100, 1e-9);
  o.bucket_mb = 0;  // Horovod's threshold 0: no fusion
  EXPECT_EQ(predict_step(p, o).buckets.size(), 2u);
}

TEST(StepCost, CyclesWaitForAllReducesThatOutlastACycleAndPayTheAgreement) {
  // Two 3 MiB layers on a 1 GiB/s link with latency L = 2^-14 s: each
  // all-reduce takes A = 3/1024 s + 2L (two rounds) and every cycle with
  // work pays v = 2L to agree (one round each way between two nodes). All
  // times are multiples of 1/1024 ms, so exact. Forward 2 ms, backward 2 + 2
  // ms, no optimizer: ready at 4 and 6 in a 6 ms step; a 1 ms cycle.
  // The cycle at 4 finds the last layer: v, then A. The next cycle starts
  // when that ends (later than 5): v, then the first layer's A. Exposed:
  // 4 + 2v + 2A - 6, the same every step (each step starts on a cycle, so
  // its last layer is ready exactly on one: ready <= cycle counts).
  const double mib3 = 3 * kMiB, latency_s = 1.0 / 16384;
  StepOptions o{.replicas = 2,
                .micro_batch = 1,
                .topology = {.inter = {double(1 << 30), latency_s}},
                .algorithm = Algorithm::Ring,
                .launch = StepOptions::Launch::Cycles,
                .cycle_ms = 1};
  const Profile p{.model = "two layers",
                  .layers = {{"first", mib3, 1, 2}, {"last", mib3, 1, 2}},
                  .micro_batch = 1,
                  .step_compute_ms = 6};
  const double v = 2e3 * latency_s, a = 1e3 * 3.0 / 1024 + 2e3 * latency_s;
  const StepPrediction s = predict_step(p, o);
  EXPECT_DOUBLE_EQ(s.exposed_comm_ms, 2 * v + 2 * a - 2);
  EXPECT_DOUBLE_EQ(s.negotiation_ms, 2 * v);
  EXPECT_DOUBLE_EQ(s.comm_ms, 2 * a);
  ASSERT_EQ(s.buckets.size(), 2u);
  EXPECT_DOUBLE_EQ(s.buckets[0].start_ms, 4 + v);
  EXPECT_DOUBLE_EQ(s.buckets[1].start_ms, s.buckets[0].end_ms + v);
}

TEST(StepCost, CyclesAgreementScalesWithTheTreeDepth) {
  // 8 replicas, 4 per node: a gather and a broadcast of log2(4) = 2 rounds
  // inside nodes (5 us) and log2(2) = 1 across (10 us): 2 x (10 + 10) = 40 us.
  // One layer: one cycle with work per step.
  StepOptions o{.replicas = 8,
                .micro_batch = 1,
                .topology = {.per_node = 4, .intra = {1e12, 5e-6}, .inter = {1e12, 10e-6}},
                .algorithm = Algorithm::Ring,
                .launch = StepOptions::Launch::Cycles,
                .cycle_ms = 1};
  const Profile p{.model = "one layer", .layers = {{"only", 1000, 1, 1}}, .micro_batch = 1, .step_compute_ms = 2};
  EXPECT_NEAR(predict_step(p, o).negotiation_ms, 0.04, 1e-12);

  // One replica communicates nothing, so it waits for no cycle.
  o.replicas = 1;
  const StepPrediction one = predict_step(p, o);
  EXPECT_EQ(one.exposed_comm_ms, 0);
  EXPECT_EQ(one.negotiation_ms, 0);
}

TEST(StepCost, ExpectedMaxOfNormalsMatchesClosedForms) {
  const double root_pi = std::sqrt(std::numbers::pi);
  EXPECT_EQ(expected_max_normal(1), 0);
  EXPECT_NEAR(expected_max_normal(2), 1 / root_pi, 1e-9);
  EXPECT_NEAR(expected_max_normal(3), 3 / (2 * root_pi), 1e-9);
  // Tabulated (Harter 1961): 4 -> 1.02938, 5 -> 1.16296, 10 -> 1.53875, 100 -> 2.50759.
  EXPECT_NEAR(expected_max_normal(4), 1.02938, 1e-5);
  EXPECT_NEAR(expected_max_normal(5), 1.16296, 1e-5);
  EXPECT_NEAR(expected_max_normal(10), 1.53875, 1e-5);
  EXPECT_NEAR(expected_max_normal(100), 2.50759, 1e-5);
  double last = 0;
  for (int n = 2; n <= (1 << 20); n *= 2) {  // grows, and slower than sqrt(2 ln n)
    const double e = expected_max_normal(n);
    EXPECT_GT(e, last) << n;
    EXPECT_LT(e, std::sqrt(2 * std::log(double(n)))) << n;
    last = e;
  }
  EXPECT_THROW(expected_max_normal(0), InvalidArgument);
}

TEST(StepCost, StragglersStretchComputeAndReadyTimes) {
  // Two replicas and c = 0.1 sqrt(pi): the slower computes 1 + c / sqrt(pi) =
  // 1.1 x the mean. Forward 2.2 ms, backward 2.2 then 3.3 ms: bucket 0 ready
  // at 4.4 ms, bucket 1 at 7.7 ms and started when the stream frees at
  // 4.4 + 4.194 ms; the optimizer (0.5 ms) waits for no one.
  const Profile p = two_layers(8 * kMiB, 3, 4 * kMiB, 2);
  StepOptions o = two_replicas();
  o.compute_cv = 0.1 * std::sqrt(std::numbers::pi);
  const StepPrediction s = predict_step(p, o);
  ASSERT_EQ(s.buckets.size(), 2u);
  EXPECT_NEAR(s.buckets[0].ready_ms, 4.4, 1e-8);
  EXPECT_NEAR(s.buckets[1].ready_ms, 7.7, 1e-8);
  EXPECT_NEAR(s.buckets[1].start_ms, 4.4 + 4 * kMiB / 1e6, 1e-8);
  EXPECT_NEAR(s.compute_ms, 8.2, 1e-8);
  EXPECT_NEAR(s.straggler_ms, 0.7, 1e-8);
  EXPECT_NEAR(s.exposed_comm_ms, 4.4 + 12 * kMiB / 1e6 - 7.7, 1e-8);
  EXPECT_NEAR(s.step_ms, s.compute_ms + s.exposed_comm_ms, 1e-9);

  // Four micro-steps average their jitter: c / sqrt(4), so 2c gives 1.1 again.
  StepOptions k = o;
  k.accumulate = 4;
  k.compute_cv = 2 * o.compute_cv;
  EXPECT_NEAR(predict_step(p, k).compute_ms, 4 * 7 * 1.1 + 0.5, 1e-8);

  // One replica waits for no one.
  StepOptions one = o;
  one.replicas = 1;
  EXPECT_EQ(predict_step(p, one).step_ms, predict_step(p, {.replicas = 1, .micro_batch = 1}).step_ms);
  EXPECT_EQ(predict_step(p, one).straggler_ms, 0);
}

TEST(StepCost, MoreReplicasWaitLongerForTheSlowest) {
  const Profile p = mlp_on_cpu(32);
  double last = 0;
  for (int n = 2; n <= 1024; n *= 2) {
    const StepPrediction s = predict_step(p, {.replicas = n, .compute_cv = 0.05});
    EXPECT_GT(s.straggler_ms, last) << n;
    EXPECT_LE(s.step_ms, predict_step(p, {.replicas = n, .compute_cv = 0.1}).step_ms) << n;
    // The closed form: forward and backward stretched by 1 + c e_N, and the
    // wait is what that adds.
    const double slowest = 1 + 0.05 * expected_max_normal(n);
    EXPECT_NEAR(s.straggler_ms, (s.forward_ms + s.backward_ms) * (1 - 1 / slowest), 1e-9) << n;
    EXPECT_NEAR(s.forward_ms, slowest * predict_step(p, {.replicas = n}).forward_ms, 1e-9) << n;
    last = s.straggler_ms;
  }
}

// Jitter averages over the step's work however it grows: 4 accumulated
// micro-steps of 32 and one micro-step of 128 both vary by c / 2, so they
// wait for the slowest of 16 alike, a quarter of the work apart.
TEST(StepCost, BiggerMicroBatchesAndAccumulationAverageJitterAlike) {
  const Profile p = mlp_on_cpu(32);
  const StepPrediction k4 = predict_step(p, {.replicas = 16, .micro_batch = 32, .accumulate = 4, .compute_cv = 0.1});
  const StepPrediction b128 = predict_step(p, {.replicas = 16, .micro_batch = 128, .compute_cv = 0.1});
  const double slowest = 1 + 0.05 * expected_max_normal(16);
  EXPECT_NEAR(k4.straggler_ms / (k4.forward_ms + k4.backward_ms), 1 - 1 / slowest, 1e-12);
  EXPECT_NEAR(b128.straggler_ms / (b128.forward_ms + b128.backward_ms), 1 - 1 / slowest, 1e-12);
}

TEST(StepCost, BadOptionsAreRejected) {
  const Profile p = mlp_on_cpu(32);
  EXPECT_THROW(predict_step(p, {.replicas = 0}), InvalidArgument);
  EXPECT_THROW(predict_step(p, {.micro_batch = 0}), InvalidArgument);
  EXPECT_THROW(predict_step(p, {.accumulate = 0}), InvalidArgument);
  EXPECT_THROW(predict_step(p, {.bucket_mb = -1}), InvalidArgument);
  EXPECT_THROW(predict_step(p, {.host_cores = -1}), InvalidArgument);
  EXPECT_THROW(predict_step(p, {.host_latency_s = -1e-6}), InvalidArgument);
  EXPECT_THROW(predict_step(p, {.launch = StepOptions::Launch::Cycles, .cycle_ms = 0}), InvalidArgument);
  EXPECT_THROW(predict_step(p, {.launch = StepOptions::Launch::Cycles, .cycle_ms = INFINITY}), InvalidArgument);
  EXPECT_THROW(predict_step(p, {.compute_cv = -0.01}), InvalidArgument);
  EXPECT_THROW(predict_step(p, {.compute_cv = NAN}), InvalidArgument);
  EXPECT_THROW(predict_step(Profile{}, {}), InvalidArgument);
  // A profile built by hand is checked too: every size and time a number of zero or more.
  for (auto spoil : std::vector<std::function<void(Profile&)>>{
           [](Profile& q) { q.layers[0].param_bytes = -4; },
           [](Profile& q) { q.layers[0].param_bytes = NAN; },
           [](Profile& q) { q.layers[1].forward_ms = -1; },
           [](Profile& q) { q.layers[1].backward_ms = INFINITY; },
           [](Profile& q) { q.step_compute_ms = NAN; },
           [](Profile& q) { q.activation_bytes_per_sample = -1; }}) {
    Profile q = p;
    spoil(q);
    EXPECT_THROW(predict_step(q, {}), InvalidArgument);
  }
}

}  // namespace
}  // namespace lockstep::cost
