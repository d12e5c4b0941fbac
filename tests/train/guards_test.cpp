// The guards end to end: the start-up handshake, the divergence detector
// with injected bit flips, and symmetric decisions (non-finite gradients,
// one replica's error).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "lockstep/error.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/trainer.h"
#include "synthetic_data.h"
#include "train/guards.h"

namespace lockstep::train {
namespace {

using testing::synthetic_data;

TrainConfig config(int replicas = 4) {
  TrainConfig c;
  c.replicas = replicas;
  c.micro_batch = 16;
  c.hidden = {32, 16};
  c.steps = 12;
  c.evaluate = false;
  c.timeout = std::chrono::seconds(20);
  return c;
}

std::string error_of(const TrainConfig& c, const TrainHooks& hooks = {}) {
  try {
    train(c, synthetic_data(1024), hooks);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Every replica's weights and optimizer state after every step.
struct Snapshots {
  std::mutex mu;
  std::map<std::int64_t, std::map<int, std::vector<float>>> at;  // step -> rank -> state
  TrainHooks hooks() {
    TrainHooks h;
    h.on_replica_step = [this](int rank, std::int64_t step, std::span<const float> p,
                               std::span<const float> s) {
      std::vector<float> v(p.begin(), p.end());
      v.insert(v.end(), s.begin(), s.end());
      std::lock_guard lock(mu);
      at[step][rank] = std::move(v);
    };
    return h;
  }
  bool identical(std::int64_t step) {
    const auto& ranks = at.at(step);
    for (const auto& [r, v] : ranks)
      if (v.size() != ranks.at(0).size() || std::memcmp(v.data(), ranks.at(0).data(), v.size() * 4) != 0)
        return false;
    return true;
  }
};

// The issue's cases: one replica started with another seed, lr, hidden width
// or bucket layout refuses to start, naming the field and the rank.
TEST(Handshake, OneReplicaWithAnotherConfigRefusesToStart) {
  const std::map<std::string, std::function<void(TrainConfig&)>> cases = {
      {"--seed", [](TrainConfig& c) { c.seed = 7; }},
      {"--lr", [](TrainConfig& c) { c.lr = 0.2f; }},
      {"model (parameter names, shapes and order)",
       [](TrainConfig& c) {
         c.hidden = {33, 16};
       }},
      {"bucket layout", [](TrainConfig& c) { c.first_bucket_mb = 0.0001; }},
      {"--log-every", [](TrainConfig& c) { c.log_every = 3; }},
      {"test evaluation", [](TrainConfig& c) { c.evaluate = !c.evaluate; }},
  };
  for (const auto& [field, perturb_] : cases) {
    const auto& perturb = perturb_;  // a lambda captures it (clang 14 cannot capture a binding)
    TrainHooks hooks;
    hooks.on_replica_config = [&](int rank, TrainConfig& c) {
      if (rank == 2) perturb(c);
    };
    const auto what = error_of(config(), hooks);
    EXPECT_NE(what.find("start-up handshake refused: " + field), std::string::npos) << what;
    EXPECT_NE(what.find("differs on rank 2 from ranks 0, 1 and 3"), std::string::npos) << what;
  }
  EXPECT_EQ(error_of(config()), "(no error)");
}

// A bit flipped on rank 3 after step 5 is caught at the next check (steps
// 7 with K = 4: (step + 1) % K == 0), naming the rank and the tensor.
TEST(Divergence, BitFlipStopsNamingRankTensorAndStep) {
  auto c = config(5);
  c.check_every = 4;
  c.inject = {fault_from_string("bitflip@5:3")};
  const auto what = error_of(c);
  const auto layout = make_model(c, 48, 10)->layout();
  std::string tensor;
  for (const auto& t : layout.tensors())
    if (layout.numel() / 2 >= t.offset && layout.numel() / 2 < t.offset + t.numel) tensor = t.name;
  EXPECT_NE(
      what.find("replicas diverged by step 7: " + tensor + " on rank 3 differs from ranks 0, 1, 2 and 4"),
      std::string::npos)
      << what;
}

// The weights a run ends with are always compared: a flip after the last
// whole check interval (here the run is shorter than one) is caught after
// the last step, not handed to --save.
TEST(Divergence, TheLastStepIsCheckedWhateverTheInterval) {
  auto c = config(3);
  c.check_every = 20;  // longer than the run's 12 steps
  c.inject = {fault_from_string("bitflip@9:1")};
  const auto what = error_of(c);
  EXPECT_NE(what.find("replicas diverged by step 11: "), std::string::npos) << what;
  EXPECT_NE(what.find("on rank 1 differs from ranks 0 and 2"), std::string::npos) << what;
  c.inject.clear();
  EXPECT_EQ(train(c, synthetic_data(1024)).divergence_checks, 1);
}

// Repair re-broadcasts from a majority replica: identical again from the
// next step on, and training goes on. Without the detector the same flip
// goes unnoticed: the replicas silently disagree to the end.
TEST(Divergence, RepairMakesReplicasIdenticalAgainAndTrainingGoesOn) {
  auto c = config(5);
  c.check_every = 1;
  c.on_divergence = OnDivergence::Repair;
  c.inject = {fault_from_string("bitflip@5:3")};
  Snapshots snaps;
  auto hooks = snaps.hooks();
  std::mutex mu;
  std::vector<std::string> warnings;
  hooks.on_warning = [&](const std::string& w) {
    std::lock_guard lock(mu);
    warnings.push_back(w);
  };
  const auto r = train(c, synthetic_data(1024), hooks);
  EXPECT_EQ(r.repairs, 1);
  EXPECT_EQ(r.divergence_checks, 12);
  EXPECT_TRUE(snaps.identical(4));
  EXPECT_FALSE(snaps.identical(5)) << "the flip was not injected";
  for (std::int64_t s = 6; s < 12; ++s) EXPECT_TRUE(snaps.identical(s)) << "step " << s;
  bool named = false;
  for (const auto& w : warnings)
    named |= w.find("on rank 3") != std::string::npos && w.find("repaired") != std::string::npos;
  EXPECT_TRUE(named);

  c.check_every = 0;
  Snapshots unchecked;
  train(c, synthetic_data(1024), unchecked.hooks());
  EXPECT_FALSE(unchecked.identical(11));
}

// Two replicas that disagree have no majority. The flip is on rank 0: the
// detector named rank 1 as the one that differed and repair re-broadcast
// rank 0's flipped weights over the healthy replica. Now the message names
// both without blaming either, and repair refuses instead of guessing.
TEST(Divergence, WithoutAMajorityNeitherReplicaIsBlamedOrRepairedFrom) {
  auto c = config(2);
  c.check_every = 1;
  c.inject = {fault_from_string("bitflip@3:0")};
  for (auto policy : {OnDivergence::Stop, OnDivergence::Repair}) {
    c.on_divergence = policy;
    const auto what = error_of(c);
    EXPECT_NE(what.find("replicas diverged by step 3: "), std::string::npos) << what;
    EXPECT_NE(what.find(" differs between rank 0 and rank 1, and no value is held by a majority"), std::string::npos)
        << what;
    EXPECT_EQ(what.find("on rank 1 differs"), std::string::npos) << what;
    EXPECT_EQ(what.find("use --on-divergence repair"), std::string::npos) << "repair would refuse too:\n" << what;
    if (policy == OnDivergence::Repair) {
      EXPECT_NE(what.find("without a majority no replica can be trusted to repair the others"), std::string::npos)
          << what;
    }
  }
}

// A NaN in rank 2's local gradient at step 4: every replica skips step 4
// (weights and optimizer state unchanged and identical), the log names rank
// 2, and training goes on.
TEST(SymmetricDecisions, NonFiniteGradientIsSkippedByEveryReplica) {
  for (const char* opt : {"sgd", "adamw"}) {
    auto c = config();
    c.optimizer = opt;
    c.inject = {fault_from_string("nan@4:2")};
    Snapshots snaps;
    auto hooks = snaps.hooks();
    std::string warning;
    hooks.on_warning = [&](const std::string& w) { warning = w; };  // rank 0 only
    const auto r = train(c, synthetic_data(1024), hooks);
    ASSERT_EQ(r.skipped.size(), 1u);
    EXPECT_EQ(r.skipped[0].step, 4);
    EXPECT_EQ(r.skipped[0].ranks, std::vector<int>{2});
    EXPECT_NE(warning.find("step 4: non-finite gradient on rank 2; every replica skipped"), std::string::npos)
        << warning;
    for (std::int64_t s = 0; s < 12; ++s) EXPECT_TRUE(snaps.identical(s)) << opt << " step " << s;
    EXPECT_EQ(snaps.at[4], snaps.at[3]) << "the skipped step changed the state";
    EXPECT_NE(snaps.at[5], snaps.at[4]) << "training did not go on";
    EXPECT_TRUE(std::isfinite(r.final_loss));
  }
}

// The local check that feeds the sentinel: NaN and infinities, and finite
// values large enough that the sum over the replicas could overflow in any
// element (the sentinel only carries element 0: an overflow elsewhere was
// applied by every replica).
TEST(SymmetricDecisions, ValuesThatCouldOverflowTheSumCountAsNonFinite) {
  const float limit = train::detail::overflow_limit(8);
  EXPECT_FLOAT_EQ(limit, std::numeric_limits<float>::max() / 16);
  EXPECT_FALSE(train::detail::has_nonfinite(std::vector<float>{1, -2, 0, -0.0f, 1e-45f, -limit}, limit));
  EXPECT_TRUE(train::detail::has_nonfinite(std::vector<float>{1, std::nextafter(limit, 1e38f)}, limit));
  EXPECT_TRUE(train::detail::has_nonfinite(std::vector<float>{-3e38f, 1}, limit));
  EXPECT_TRUE(train::detail::has_nonfinite(std::vector<float>{1, std::numeric_limits<float>::infinity()}, limit));
  EXPECT_TRUE(train::detail::has_nonfinite(std::vector<float>{std::numeric_limits<float>::quiet_NaN()}, limit));
  EXPECT_FALSE(train::detail::has_nonfinite(std::vector<float>{3e38f}));  // no limit given: finite is fine
  // An infinite or NaN limit still flags infinities and NaN.
  for (const float no_limit : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_TRUE(train::detail::has_nonfinite(std::vector<float>{std::numeric_limits<float>::infinity()}, no_limit));
    EXPECT_TRUE(train::detail::has_nonfinite(std::vector<float>{std::numeric_limits<float>::quiet_NaN()}, no_limit));
    EXPECT_FALSE(train::detail::has_nonfinite(std::vector<float>{3e38f}, no_limit));
  }
  // 16 values at the limit (8 replicas, weights adding up to 8, twice over) stay finite.
  float sum = 0;
  for (int i = 0; i < 16; ++i) sum += limit;
  EXPECT_TRUE(std::isfinite(sum));
}

TEST(SymmetricDecisions, ConsecutiveSkipsStopEveryReplica) {
  auto c = config();
  c.max_skips = 3;
  for (int s : {3, 4, 5}) c.inject.push_back(fault_from_string("nan@" + std::to_string(s) + ":1"));
  const auto what = error_of(c);
  EXPECT_NE(
      what.find("stopped: 3 consecutive steps had non-finite gradients (the last, step 5, from rank 1)"),
      std::string::npos)
      << what;
  c.inject.erase(c.inject.begin() + 1);  // steps 3 and 5: not consecutive
  EXPECT_EQ(error_of(c), "(no error)");
}

// A run of skipped steps goes on across a checkpoint: a run resumed from a
// checkpoint written after the first of two consecutive skips stops at the
// second, as the unbroken run does (Note [Skips across a resume]: the count
// is in the file; a resumed run that started it again at 0 trained on where
// the unbroken run had stopped).
TEST(SymmetricDecisions, ConsecutiveSkipsCountAcrossAResume) {
  const auto data = synthetic_data(1024);  // error_of's
  const auto path = std::filesystem::temp_directory_path() /
                    ("lockstep_skips_" + std::to_string(::getpid()) + ".st");
  auto c = config();
  c.max_skips = 2;
  c.checkpoint_every = 4;
  c.inject = {fault_from_string("nan@3:1"), fault_from_string("nan@4:1")};
  std::vector<std::int64_t> written;  // steps_done, skips_in_a_row of each checkpoint
  TrainHooks hooks;
  hooks.on_checkpoint = [&](const Checkpoint& cp) {
    written.insert(written.end(), {cp.steps_done, cp.skips_in_a_row});
    save_checkpoint(path, cp, trajectory_fields(c, data, "threads"), c.model);
  };
  const std::string unbroken = error_of(c, hooks);
  EXPECT_NE(unbroken.find("stopped: 2 consecutive steps had non-finite gradients (the last, step 4, from rank 1)"),
            std::string::npos)
      << unbroken;
  EXPECT_EQ(written, (std::vector<std::int64_t>{4, 1}));  // after step 3, the first skip

  auto resumed = c;
  resume_from(resumed, data, load_checkpoint(path, c, data), "threads");
  std::filesystem::remove(path);
  EXPECT_EQ(resumed.start_step, 4);
  EXPECT_EQ(resumed.initial_skips_in_a_row, 1);
  EXPECT_EQ(error_of(resumed), unbroken);
}

// One replica's error stops all of them with that error, well within the
// collectives' timeout (a wall-clock guard, not a timing threshold: a hang
// would take the 20 s timeout).
TEST(SymmetricDecisions, InjectedThrowStopsAllReplicas) {
  auto c = config(8);
  c.inject = {fault_from_string("throw@3:5")};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(error_of(c).find("rank 5: injected failure at step 3"), std::string::npos) << error_of(c);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15)) << "replicas hung";
}

// The card's same-seed bug: every replica reads rank 0's shard. The first
// check (step K - 1) stops the run, naming the bug, long before the epoch
// ends; a normal run passes every check, one per K steps and one at the end.
TEST(DataAccounting, SameSeedStopsAtTheFirstCheckNamingTheBug) {
  auto c = config(4);
  c.steps = 40;
  c.check_every = 8;
  c.inject = {fault_from_string("same-seed")};
  const auto what = error_of(c);
  EXPECT_NE(what.find("data accounting failed by step 7: ranks 0, 1, 2 and 3 read identical samples"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("same-seed bug"), std::string::npos) << what;

  c.inject.clear();
  const auto r = train(c, synthetic_data(1024));
  EXPECT_EQ(r.accounting_checks, 5);  // steps 7, 15, 23, 31, 39 (the last is also the run's end)
  c.check_every = 0;                    // detector off: accounting still runs at every epoch's end
  c.steps = 40;
  EXPECT_EQ(train(c, synthetic_data(1024)).accounting_checks, 3);  // 16 steps per epoch: 15, 31, 39
}

// Note [Audit before a checkpoint]: with the detector off (--check-every 0)
// a mid-epoch checkpoint still audits the reads it keeps. Without it the
// same-seed run wrote checkpoints after steps 4, 9 and 14 unaudited; one
// resumed from them (after a failure, or launch --max-restarts) reported
// every sample read exactly once.
TEST(DataAccounting, ACheckpointAuditsTheReadsItKeepsWithTheDetectorOff) {
  auto c = config(4);
  c.steps = 40;  // 16 steps per epoch of 1024
  c.check_every = 0;
  c.checkpoint_every = 5;
  c.inject = {fault_from_string("same-seed")};
  int checkpoints = 0;
  TrainHooks hooks;
  hooks.on_checkpoint = [&](const Checkpoint&) { ++checkpoints; };
  const auto what = error_of(c, hooks);
  EXPECT_NE(what.find("data accounting failed by step 4: ranks 0, 1, 2 and 3 read identical samples"),
            std::string::npos)
      << what;
  EXPECT_EQ(checkpoints, 0);

  c.inject.clear();  // a clean run: audited at every checkpoint (4, 9, 14, 15 the epoch's end, ...)
  checkpoints = 0;
  const auto r = train(c, synthetic_data(1024), hooks);
  EXPECT_EQ(checkpoints, 10);  // after steps 4, 9, 14, 15, 19, 24, 29, 31, 34, 39
  EXPECT_EQ(r.accounting_checks, 10);
}

// Buffers (batch norm running statistics): with --bn-stats sync every
// replica holds the same, so the detector covers them and a flipped bit in
// one is caught like a weight's; with local they differ by design, and the
// detector reports that as expected, not as divergence.
TEST(Divergence, BufferBitFlipIsCaughtWithSyncStatsAndExpectedWithLocal) {
  auto c = config(4);
  c.model = "cnn";
  c.micro_batch = 8;
  c.check_every = 4;
  const auto data = synthetic_data(512, 28 * 28);
  c.bn_stats = BnStats::Sync;
  c.record_timeline = true;
  const auto clean = train(c, data);
  c.record_timeline = false;
  EXPECT_EQ(clean.buffer_checks_differing, 0);
  EXPECT_EQ(clean.divergence_checks, 3);
  // The buffers' all-reduce is communication the step waits for, on its own
  // span; the wait for the OS between it and the gradients' is not.
  for (int replica = 0; replica < 4; ++replica) {
    for (std::int64_t step = 0; step < clean.steps; ++step) {
      double backward_end = 0, gradients_end = 0, buffers_us = -1, exposed_us = 0;
      for (const auto& e : clean.timeline) {
        if (e.replica != replica || e.step != step) continue;
        if (e.phase == Phase::Backward) backward_end = std::max(backward_end, e.end_us);
        if (e.phase == Phase::Allreduce && e.name == "allreduce buffers") buffers_us = e.end_us - e.start_us;
        else if (e.phase == Phase::Allreduce) gradients_end = std::max(gradients_end, e.end_us);
        if (e.phase == Phase::Exposed) exposed_us += e.end_us - e.start_us;
      }
      ASSERT_GE(buffers_us, 0) << "replica " << replica << " step " << step;
      EXPECT_NEAR(exposed_us, std::max(0.0, gradients_end - backward_end) + buffers_us, 1e-6)
          << "replica " << replica << " step " << step;
    }
  }
  c.inject = {fault_from_string("bitflip-buffer@5:2")};
  std::string what;
  try {
    train(c, data);
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("replicas diverged by step 7: "), std::string::npos) << what;
  EXPECT_NE(what.find("(buffer) on rank 2 differs from ranks 0, 1 and 3"), std::string::npos) << what;

  // With local statistics the flip would be lost among differences that are
  // expected, and the detector leaves buffers out: refused, as a fault no
  // guard could see. With one replica, so is a weight's bit flip.
  c.bn_stats = BnStats::Local;
  EXPECT_THROW(train(c, data), InvalidArgument);
  auto alone = c;
  alone.replicas = 1;
  alone.inject = {fault_from_string("bitflip@5:0")};
  EXPECT_THROW(train(alone, data), InvalidArgument);
  c.inject.clear();
  EXPECT_EQ(train(c, data).buffer_checks_differing, 3);
}

TEST(Inject, SpecsParseOrAreRefused) {
  const auto f = fault_from_string("bitflip@20:3");
  EXPECT_EQ(f.kind, Fault::Kind::BitFlip);
  EXPECT_EQ(f.step, 20);
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(fault_from_string("nan@0:0").kind, Fault::Kind::NaN);
  EXPECT_EQ(fault_from_string("same-seed").kind, Fault::Kind::SameSeed);
  EXPECT_EQ(fault_from_string("bitflip-buffer@3:1").kind, Fault::Kind::BufferBitFlip);
  for (const char* bad :
       {"", "bitflip", "bitflip@", "bitflip@1", "flip@1:2", "nan@-1:2", "nan@1:x", "nan@1:99999"})
    EXPECT_THROW(fault_from_string(bad), InvalidArgument) << bad;
  auto c = config();
  c.inject = {fault_from_string("nan@1:4")};  // 4 replicas: ranks 0..3
  EXPECT_NE(error_of(c).find("ranks are 0..3"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::train
