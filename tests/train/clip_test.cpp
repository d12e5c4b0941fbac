// --clip-grad-norm and --lr-warmup end to end: the update uses the averaged
// gradient scaled to the norm; every replica clips alike on every path, so
// --zero 1 keeps --zero 0's bits and --deterministic stays bit-exact for any
// replica count; the warmup's learning rates are the schedule's; both resume.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>

#include "lockstep/ddp/grad_clip.h"
#include "lockstep/error.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/trainer.h"
#include "synthetic_data.h"
#include "train_helpers.h"

namespace lockstep::train {
namespace {

using testing::bucketed_config;
using testing::expect_refused;
using testing::same_bits;
using testing::synthetic_data;

// SGD's momentum after the first step is the gradient the update used (torch:
// buf = grad), so it shows what clipping did: the unclipped run's averaged
// gradient g, times max / (|g| + 1e-6) when |g| is over max, on every replica.
TEST(Clip, TheFirstUpdateUsesTheAveragedGradientScaledToTheNorm) {
  const auto data = synthetic_data(1024);
  auto c = bucketed_config(4);
  c.steps = 1;
  auto first_momentum = [&](const TrainConfig& config, TrainResult* result) {
    std::map<int, std::vector<float>> by_rank;
    std::mutex m;
    TrainHooks hooks;
    hooks.on_replica_step = [&](int rank, std::int64_t, std::span<const float>, std::span<const float> state) {
      std::lock_guard lock(m);
      by_rank[rank].assign(state.begin(), state.end());
    };
    *result = train(config, data, hooks);
    for (const auto& [rank, state] : by_rank) EXPECT_TRUE(same_bits(state, by_rank[0])) << "rank " << rank;
    return by_rank[0];
  };
  TrainResult plain, clipped, loose;
  const auto g = first_momentum(c, &plain);
  const double norm = std::sqrt(ddp::sum_of_squares_naive(g));
  ASSERT_GT(norm, 0);
  EXPECT_TRUE(plain.grad_norms.empty());

  auto tight = c;
  tight.clip_grad_norm = float(norm / 4);
  const auto scaled = first_momentum(tight, &clipped);
  ASSERT_EQ(clipped.grad_norms.size(), 1u);
  EXPECT_NEAR(clipped.grad_norms[0], norm, 1e-9 * norm);
  EXPECT_EQ(clipped.clipped_steps, 1);
  const float factor = float(double(tight.clip_grad_norm) / (clipped.grad_norms[0] + 1e-6));
  ASSERT_EQ(scaled.size(), g.size());
  for (std::size_t i = 0; i < g.size(); ++i) ASSERT_EQ(scaled[i], g[i] * factor) << i;
  EXPECT_NEAR(std::sqrt(ddp::sum_of_squares_naive(scaled)), norm / 4, 1e-5 * norm);

  auto wide = c;
  wide.clip_grad_norm = float(norm * 2);
  EXPECT_TRUE(same_bits(first_momentum(wide, &loose), g)) << "a gradient under the norm is left alone";
  EXPECT_EQ(loose.clipped_steps, 0);
  EXPECT_TRUE(same_bits(loose.params, plain.params));
}

// Every path computes the norm in one order per mode, so: --zero 1 (each
// replica sums its own chunks, the sums exchanged) trains --zero 0's bits,
// at 3 replicas (uneven chunks) and 8, SGD and AdamW, shared memory and
// ring; and --deterministic, with or without --zero 1, gives one set of
// bits for 1, 2 and 4 replicas. Each clips at most steps, and the weights
// differ from the unclipped run's.
TEST(Clip, EveryReplicaClipsAlikeOnEveryPath) {
  const auto data = synthetic_data(1003);
  for (const char* opt : {"sgd", "adamw"}) {
    for (auto algorithm : {comm::Algorithm::Auto, comm::Algorithm::Ring}) {
      for (int n : {3, 8}) {
        SCOPED_TRACE(std::string(opt) + " " + comm::to_string(algorithm) + " n=" + std::to_string(n));
        auto replicated = bucketed_config(n);
        replicated.optimizer = opt;
        replicated.lr = replicated.optimizer == "adamw" ? 1e-2f : 0.5f;
        replicated.algorithm = algorithm;
        replicated.clip_grad_norm = 0.3f;
        auto sharded = replicated;
        sharded.zero = 1;
        auto unclipped = replicated;
        unclipped.clip_grad_norm = 0;
        const auto a = train(replicated, data), b = train(sharded, data);
        EXPECT_TRUE(same_bits(a.params, b.params));
        EXPECT_EQ(a.grad_norms, b.grad_norms);
        EXPECT_GT(a.clipped_steps, 6);
        EXPECT_EQ(a.clipped_steps, b.clipped_steps);
        EXPECT_EQ(a.traffic[0].clip, 0u) << "every replica holds the mean: no communication";
        EXPECT_GT(b.traffic[1].clip, 0u);
        EXPECT_EQ(b.traffic[1].unaccounted, 0u);
        EXPECT_FALSE(same_bits(a.params, train(unclipped, data).params));
      }
    }
  }
  auto one = bucketed_config(1);
  one.micro_batch = 64;
  one.deterministic = true;
  one.atom = 8;
  one.clip_grad_norm = 0.3f;
  const auto first = train(one, data);
  EXPECT_GT(first.clipped_steps, 6);
  for (int n : {2, 4}) {
    for (int zero : {0, 1}) {
      auto c = one;
      c.replicas = n;
      c.micro_batch = 64 / n;
      c.zero = zero;
      const auto r = train(c, data);
      EXPECT_TRUE(same_bits(r.params, first.params)) << "n=" << n << " zero " << zero;
      EXPECT_EQ(r.grad_norms, first.grad_norms) << "n=" << n << " zero " << zero;
    }
  }
}

// The learning rates the run uses are optim::learning_rate's with the
// warmup; and a run resumed mid-warmup, clipping, ends as the unbroken run.
TEST(Clip, WarmupRatesAndAResumedClippedRun) {
  const auto data = synthetic_data(1024);
  auto c = bucketed_config(2);
  c.steps = 20;
  c.lr_warmup = 8;
  c.log_every = 1;
  c.clip_grad_norm = 0.3f;
  c.checkpoint_every = 5;
  std::vector<float> rates;
  std::vector<std::vector<float>> kept;  // the checkpoint after step 5: weights, optimizer state
  std::int64_t optimizer_steps = -1;
  TrainHooks hooks;
  hooks.on_progress = [&](const Progress& p) {
    rates.push_back(p.lr);
    EXPECT_TRUE(p.grad_norm.has_value());
  };
  hooks.on_checkpoint = [&](const Checkpoint& cp) {
    if (cp.steps_done != 5) return;
    kept.assign({{cp.params.begin(), cp.params.end()}, {cp.optimizer_state.begin(), cp.optimizer_state.end()}});
    optimizer_steps = cp.optimizer_steps;
  };
  const auto whole = train(c, data, hooks);
  ASSERT_EQ(rates.size(), 20u);
  for (std::int64_t s = 0; s < 20; ++s) {
    EXPECT_EQ(rates[std::size_t(s)], optim::learning_rate(optim::Schedule::Cosine, c.lr, s, 20, 8)) << s;
  }
  EXPECT_EQ(rates[0], c.lr / 8);
  EXPECT_EQ(rates[7], c.lr);
  ASSERT_EQ(kept.size(), 2u);
  auto resumed = c;
  resumed.start_step = 5;
  resumed.initial_params = kept[0];
  resumed.initial_optimizer_state = kept[1];
  resumed.initial_optimizer_steps = optimizer_steps;
  const auto rest = train(resumed, data);
  EXPECT_TRUE(same_bits(rest.params, whole.params));
  EXPECT_EQ(rest.grad_norms, std::vector<double>(whole.grad_norms.begin() + 5, whole.grad_norms.end()));
}

// A checkpoint written before --lr-warmup and --clip-grad-norm existed
// records neither: it resumes a run that has their defaults, and a run that
// sets either is told which differs.
TEST(Clip, ACheckpointFromBeforeTheSettingsResumesWithTheirDefaults) {
  const auto data = synthetic_data(512);
  auto c = bucketed_config(2);
  LoadedCheckpoint cp;
  cp.steps_done = 1;
  cp.steps_planned = 12;
  for (const auto& f : trajectory_fields(c, data)) {
    if (f.first != "--lr-warmup" && f.first != "--clip-grad-norm") cp.fields.push_back(f);
  }
  ASSERT_EQ(cp.fields.size() + 2, trajectory_fields(c, data).size());
  auto same = c;
  EXPECT_NO_THROW(resume_from(same, data, cp));
  auto clipping = c;
  clipping.clip_grad_norm = 1;
  clipping.lr_warmup = 3;
  try {
    resume_from(clipping, data, cp);
    ADD_FAILURE() << "new settings were accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--clip-grad-norm ('off' there, '1' here)"), std::string::npos) << what;
    EXPECT_NE(what.find("--lr-warmup ('0' there, '3' here)"), std::string::npos) << what;
  }
}

// A skipped step (a non-finite gradient) applies nothing and has no norm:
// NaN in its place, so that grad_norms[i] is always step i's. Under --zero 1
// the norm's exchange is communication, on the trace's communication track
// and counted in the step's communication time, never under --zero 0.
TEST(Clip, ASkippedStepHasNoNormAndTheExchangeIsCommunication) {
  const auto data = synthetic_data(1024);
  auto c = bucketed_config(3);
  c.steps = 8;
  c.clip_grad_norm = 0.3f;
  c.inject = {fault_from_string("nan@3:1")};
  c.record_timeline = true;
  for (int zero : {0, 1}) {
    c.zero = zero;
    const auto r = train(c, data);
    ASSERT_EQ(r.grad_norms.size(), 8u) << zero;
    ASSERT_EQ(r.skipped.size(), 1u);
    for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(std::isnan(r.grad_norms[i]), i == 3) << i;
    std::size_t exchanges = 0;
    for (const auto& e : r.timeline) {
      if (e.name != "all-reduce gradient norm") continue;
      ++exchanges;
      EXPECT_EQ(e.track, Track::Comm);
      EXPECT_GT(e.bytes, 0u);
      EXPECT_NE(e.step, 3);
    }
    EXPECT_EQ(exchanges, zero == 1 ? 7u * 3 : 0u) << "every replica, every applied step";
  }
}

// Clipping with the other paths that change what the replicas hold: bf16
// on the wire (error feedback), accumulated micro-steps, padded ragged
// shards at an epoch's end, and --zero 1 with accumulation. The divergence
// detector compares every replica's weights and optimizer state at every
// step, so a replica that scaled by another factor would stop the run.
TEST(Clip, ReplicasStayTogetherOnEveryPathThatChangesTheGradient) {
  const auto data = synthetic_data(1003);  // 20 steps of 3 x 16 an epoch, then a ragged one
  struct Case {
    const char* name;
    std::function<void(TrainConfig&)> set;
  };
  const std::vector<Case> cases = {
      {"bf16", [](TrainConfig& c) { c.compression = ddp::Compression::Bf16; }},
      {"accumulate 2", [](TrainConfig& c) { c.accumulate = 2; }},
      {"ragged pad", [](TrainConfig& c) { c.ragged = Ragged::Pad; }},
      {"zero 1, accumulate 2", [](TrainConfig& c) { c.zero = 1, c.accumulate = 2; }},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.name);
    auto c = bucketed_config(3);
    c.steps = 24;
    c.lr = 0.5f;
    c.clip_grad_norm = 0.3f;
    c.check_every = 1;
    k.set(c);
    const auto r = train(c, data);
    EXPECT_EQ(r.divergence_checks, 24);
    EXPECT_GT(r.clipped_steps, 0);
    EXPECT_EQ(r.grad_norms.size(), 24u);
  }
}

// The warmup may take the whole run: its last step is the first at --lr.
TEST(Clip, AWarmupAsLongAsTheRunEndsAtTheLearningRate) {
  const auto data = synthetic_data(512);
  auto c = bucketed_config(2);
  c.steps = 6;
  c.lr_warmup = 6;
  c.log_every = 1;
  std::vector<float> rates;
  TrainHooks hooks;
  hooks.on_progress = [&](const Progress& p) { rates.push_back(p.lr); };
  train(c, data, hooks);
  ASSERT_EQ(rates.size(), 6u);
  EXPECT_EQ(rates.front(), c.lr / 6);
  EXPECT_EQ(rates.back(), c.lr);
}

TEST(Clip, RefusesWhatCannotRun) {
  const auto data = synthetic_data(512);
  auto c = bucketed_config(2);
  c.lr_warmup = 13;
  expect_refused(c, data, "--lr-warmup 13 is longer than the run (12 steps)");
  c.lr_warmup = -1;
  expect_refused(c, data, "--lr-warmup must be 0");
  c = bucketed_config(2);
  c.clip_grad_norm = -1;
  expect_refused(c, data, "--clip-grad-norm must be a positive number");
  c.clip_grad_norm = std::nanf("");
  expect_refused(c, data, "--clip-grad-norm must be a positive number");
}

}  // namespace
}  // namespace lockstep::train
