// End-to-end properties of the trainer: the card's contract, on real threads.
#include "lockstep/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>

#include "lockstep/error.h"
#include "lockstep/nn/safetensors.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/report.h"
#include "synthetic_data.h"

namespace lockstep::train {
namespace {

using testing::max_abs_diff;
using testing::synthetic_data;

TrainConfig small_config(int replicas, std::int64_t micro_batch) {
  TrainConfig c;
  c.replicas = replicas;
  c.micro_batch = micro_batch;
  c.hidden = {64, 32};
  c.steps = 20;
  c.evaluate = false;
  c.timeout = std::chrono::seconds(20);
  return c;
}

struct EquivalenceCase {
  std::string optimizer;
  bool shuffle;
};

class Equivalence : public ::testing::TestWithParam<EquivalenceCase> {};

// The card: averaging the gradients of 8 equal shards of 32 is the gradient
// of the mean over all 256, so 8 x 32 trains the same weights as 1 x 256, up
// to floating-point reassociation. Tolerance: 2e-6 absolute on every weight
// after 20 steps (weights are O(0.1); measured differences are 2e-8 to 1.5e-7).
TEST_P(Equivalence, EightByThirtyTwoMatchesOneByTwoFiftySix) {
  const auto data = synthetic_data(4096);
  auto one = small_config(1, 256);
  auto eight = small_config(8, 32);
  for (auto* c : {&one, &eight}) {
    c->optimizer = GetParam().optimizer;
    c->lr = GetParam().optimizer == "adamw" ? 1e-3f : 0.1f;
    c->shuffle = GetParam().shuffle;
  }
  const auto a = train(one, data);
  const auto b = train(eight, data);
  EXPECT_LT(max_abs_diff(a.params, b.params), 2e-6f);
  EXPECT_NEAR(a.final_loss, b.final_loss, 1e-4);
  // And it is not trivially equal: training moved the weights.
  auto init = small_config(1, 256);
  init.steps = 1;
  init.lr = 1e-9f;
  EXPECT_GT(max_abs_diff(train(init, data).params, a.params), 1e-3f);
}

INSTANTIATE_TEST_SUITE_P(OptimizersAndShuffle, Equivalence,
                         ::testing::Values(EquivalenceCase{"sgd", true}, EquivalenceCase{"sgd", false},
                                           EquivalenceCase{"adamw", true}, EquivalenceCase{"adamw", false}),
                         [](const auto& info) {
                           return info.param.optimizer +
                                  (info.param.shuffle ? "_shuffle_on" : "_shuffle_off");
                         });

// Ragged shards weighted by sample count: an epoch of 1003 samples at a
// global batch of 256 ends with a batch of 235 (the card's 7 x 32 + 11), cut
// into shards of 29 and 30; 8 replicas must still match one replica that sees
// the same batches whole.
TEST(Equivalence, RaggedLastBatchIsWeightedBySampleCount) {
  const auto data = synthetic_data(1003);
  auto one = small_config(1, 256);
  auto eight = small_config(8, 32);
  auto seven = small_config(7, 36);  // 252 per step; the last batch of 247 splits 35/36
  for (auto* c : {&one, &eight, &seven}) {
    c->steps = 0;
    c->epochs = 2;
    c->ragged = Ragged::Weighted;
  }
  const auto a = train(one, data);
  const auto b = train(eight, data);
  EXPECT_EQ(a.steps, 8);  // ceil(1003 / 256) * 2
  // Measured: 1.2e-7 when weighted; 2.6e-5 with a plain mean of means.
  EXPECT_LT(max_abs_diff(a.params, b.params), 2e-6f);
  EXPECT_NO_THROW(train(seven, data));
}

// --bn-stats sync weights each replica's update of the running statistics
// by its samples (Note [Synchronised buffers]): 13 samples on 8 replicas x 1
// make an epoch of a full step and a ragged one of 5 samples, where 3
// replicas have none. Every step counts once, as one replica's batch norm
// counts it. (The running statistics themselves are not one replica's: each
// replica normalises its forward by its own batch.)
TEST(Equivalence, SyncedBatchNormStatisticsCountEveryStepOnceInRaggedSteps) {
  const auto data = synthetic_data(13, 28 * 28, 3, 8);
  auto c = small_config(8, 1);
  c.model = "cnn";
  c.bn_stats = BnStats::Sync;
  c.steps = 0;
  c.epochs = 2;
  c.ragged = Ragged::Weighted;
  const auto r = train(c, data);
  ASSERT_EQ(r.steps, 4);
  int seen = 0;
  for (const auto& t : r.buffer_layout.tensors()) {
    if (!t.name.ends_with("num_batches_tracked")) continue;
    EXPECT_EQ(r.buffers[t.offset], 4.0f) << t.name;  // a plain mean of the updates gave 3.25
    ++seen;
  }
  EXPECT_EQ(seen, 2);  // the CNN's two batch norms
}

// And with --accumulate K the counters count forwards, as a batch norm
// synchronised at every forward would: each micro-step that has a sample on
// some replica, even where a replica's own is empty. 2 replicas x 1 x K = 5
// on 15 samples: a full step (5 micro-steps), then 5 samples split 2 and 3.
// Under --ragged weighted each replica cuts its own rows into 5, and samples
// fall in micro-steps {2, 4} and {1, 3, 4}: 4 of 5, so 9 in all. Under pad
// both cut the largest shard's 3 rows, and samples fall in {1, 3} and
// {1, 3, 4}: 8. A weighted mean of the replicas' own counts gave 7.6 in both.
TEST(Equivalence, SyncedBatchNormCountsEveryForwardOfAnAccumulatedRaggedStep) {
  const auto data = synthetic_data(15, 28 * 28, 3, 8);
  for (const auto& [policy, counted] : {std::pair{Ragged::Weighted, 9.0f}, std::pair{Ragged::Pad, 8.0f}}) {
    SCOPED_TRACE(to_string(policy));
    auto c = small_config(2, 1);
    c.model = "cnn";
    c.bn_stats = BnStats::Sync;
    c.accumulate = 5;
    c.steps = 0;
    c.epochs = 1;
    c.ragged = policy;
    const auto r = train(c, data);
    ASSERT_EQ(r.steps, 2);
    int seen = 0;
    for (const auto& t : r.buffer_layout.tensors()) {
      if (!t.name.ends_with("num_batches_tracked")) continue;
      EXPECT_EQ(r.buffers[t.offset], counted) << t.name;
      ++seen;
    }
    EXPECT_EQ(seen, 2);
  }
}

// The invariant: after every step, every replica holds bitwise-identical
// weights and optimizer state.
TEST(Lockstep, ReplicasAreBitwiseIdenticalAfterEveryStep) {
  const auto data = synthetic_data(2048);
  for (const char* opt : {"sgd", "adamw"}) {
    auto c = small_config(8, 16);
    c.optimizer = opt;
    std::mutex mu;
    std::map<std::int64_t, std::vector<std::vector<float>>> snapshots;  // step -> per rank
    TrainHooks hooks;
    hooks.on_replica_step = [&](int rank, std::int64_t step, std::span<const float> p,
                                std::span<const float> s) {
      std::vector<float> v(p.begin(), p.end());
      v.insert(v.end(), s.begin(), s.end());
      std::lock_guard lock(mu);
      auto& row = snapshots[step];
      row.resize(8);
      row[rank] = std::move(v);
    };
    train(c, data, hooks);
    ASSERT_EQ(snapshots.size(), 20u);
    for (auto& [step, ranks] : snapshots) {
      for (int r = 1; r < 8; ++r) {
        ASSERT_EQ(ranks[r].size(), ranks[0].size());
        ASSERT_EQ(0, std::memcmp(ranks[r].data(), ranks[0].data(), ranks[0].size() * sizeof(float)))
            << opt << ": rank " << r << " differs from rank 0 after step " << step;
      }
    }
  }
}

// TrainHooks::stop_requested (lockstep train's SIGINT): one replica asking
// stops every replica at the same progress point, and the run ends there as
// at its last step: the weights are the uninterrupted run's at that step, bit
// for bit, the test set is evaluated, and the result says how far it got.
// Also under --deterministic, whose loss needs no tally all-reduce.
TEST(Stop, OneReplicaAskingStopsEveryReplicaAtTheSameStep) {
  const auto data = synthetic_data(2048);
  for (const bool deterministic : {false, true}) {
    auto c = small_config(4, 16);
    c.steps = 40;
    c.log_every = 5;
    c.deterministic = deterministic;
    c.atom = 16;
    c.stop_poll_ms = 1e9;  // votes after the first step and at progress points only (paced: the next test)
    std::vector<float> at_step_15;
    TrainHooks whole;
    whole.on_replica_step = [&](int rank, std::int64_t step, std::span<const float> p, std::span<const float>) {
      if (rank == 0 && step == 14) at_step_15.assign(p.begin(), p.end());
    };
    train(c, data, whole);

    c.evaluate = true;
    std::atomic<int> polls{0};
    std::atomic<int> ranks_polled_after_stop{0};
    TrainHooks hooks;
    // Vote points after step 1 and the progress points after steps 5, 10,
    // 15, ...: 4 polls each. Only the fourth point's first poll says yes, as
    // one replica's Ctrl-C would.
    hooks.stop_requested = [&] {
      const int k = polls.fetch_add(1);
      if (k >= 16) ranks_polled_after_stop.fetch_add(1);
      return k == 12;
    };
    const auto r = train(c, data, hooks);
    EXPECT_TRUE(r.stopped_early);
    EXPECT_EQ(r.steps, 15) << "deterministic " << deterministic;
    EXPECT_EQ(r.steps_planned, 40);
    EXPECT_EQ(ranks_polled_after_stop.load(), 0) << "a replica went on past the agreed step";
    ASSERT_EQ(r.params.size(), at_step_15.size());
    EXPECT_EQ(0, std::memcmp(r.params.data(), at_step_15.data(), at_step_15.size() * sizeof(float)))
        << "deterministic " << deterministic;
    EXPECT_TRUE(r.test_accuracy.has_value());
    EXPECT_EQ(r.samples_seen, 15 * 64);
    EXPECT_GE(r.divergence_checks, 1);
  }
}

// Note [Paced stop votes]: between progress points the replicas vote about
// every stop_poll_ms, so a stop asked for in a run of slow steps is heard
// within a poll interval, not at the next progress point (here, none before
// the last step: until 2026-12-07 this run went on to its end). It ends the
// run as a progress point would: the window's loss, the test set, a
// checkpoint of the step it stopped after.
TEST(Stop, AStopIsHeardWithinAPollIntervalNotAtTheNextProgressPoint) {
  const auto data = synthetic_data(2048);  // 32 steps an epoch at 4 x 16
  auto c = small_config(4, 16);
  c.steps = 30;
  c.log_every = 1000;
  c.stop_poll_ms = 200;
  c.evaluate = true;
  std::atomic<std::int64_t> asked_at{-1};
  std::int64_t checkpointed = -1;
  std::vector<Progress> lines;
  TrainHooks hooks;
  hooks.on_checkpoint = [&](const Checkpoint& k) { checkpointed = k.steps_done; };
  hooks.on_progress = [&](const Progress& p) { lines.push_back(p); };
  hooks.on_replica_step = [&](int rank, std::int64_t step, std::span<const float>, std::span<const float>) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // slow steps: a vote every ~4
    if (rank == 0 && step == 5) asked_at = step;
  };
  hooks.stop_requested = [&] { return asked_at.load() >= 0; };
  const auto r = train(c, data, hooks);
  EXPECT_TRUE(r.stopped_early);
  EXPECT_GT(r.steps, 5);
  // Asked during step 6: heard at its vote point or the next, 200 ms (4 steps of 50 ms or more) later.
  EXPECT_LE(r.steps, 6 + 4) << "the stop waited past a poll interval";
  EXPECT_TRUE(r.test_accuracy.has_value()) << "a stop between progress points skipped the test set";
  EXPECT_GT(r.final_loss, 0) << "a stop between progress points kept no loss";
  EXPECT_EQ(checkpointed, r.steps);
  ASSERT_EQ(lines.size(), 1u) << "the stop's progress line";
  EXPECT_EQ(lines[0].step, r.steps);
  EXPECT_EQ(lines[0].loss, r.final_loss);
}

// A run that goes on from a checkpoint (TrainHooks::on_checkpoint, then
// TrainConfig::start_step and initial_*) ends with the weights and optimizer
// state of the unbroken run, bit for bit: mid-epoch, with shuffling, for SGD
// with momentum and for AdamW (whose bias correction counts the updates),
// and under --deterministic.
TEST(Resume, FromACheckpointEndsAsTheUnbrokenRun) {
  const auto data = synthetic_data(2048);
  struct Case {
    const char* optimizer;
    bool deterministic;
  };
  for (const Case k : {Case{"sgd", false}, Case{"adamw", false}, Case{"sgd", true}}) {
    SCOPED_TRACE(std::string(k.optimizer) + (k.deterministic ? ", deterministic" : ""));
    auto c = small_config(4, 16);
    c.steps = 40;
    c.optimizer = k.optimizer;
    c.deterministic = k.deterministic;
    c.atom = 16;
    c.checkpoint_every = 7;
    c.evaluate = true;  // the test accuracy of a run resumed at its end, below
    std::vector<float> final_state;
    struct Saved {
      std::int64_t steps_done = 0, optimizer_steps = 0;
      std::vector<float> params, buffers, state;
    };
    std::vector<Saved> checkpoints;
    TrainHooks hooks;
    hooks.on_checkpoint = [&](const Checkpoint& cp) {
      EXPECT_EQ(cp.steps_planned, 40);
      checkpoints.push_back({cp.steps_done, cp.optimizer_steps, {cp.params.begin(), cp.params.end()},
                             {cp.buffers.begin(), cp.buffers.end()},
                             {cp.optimizer_state.begin(), cp.optimizer_state.end()}});
    };
    hooks.on_replica_step = [&](int rank, std::int64_t step, std::span<const float>, std::span<const float> s) {
      if (rank == 0 && step == 39) final_state.assign(s.begin(), s.end());
    };
    const auto whole = train(c, data, hooks);
    std::vector<std::int64_t> at;
    for (const auto& cp : checkpoints) at.push_back(cp.steps_done);
    const auto per_epoch = data.train.size / 64;  // 4 x 16 a step
    EXPECT_EQ(at.front(), 7);
    EXPECT_TRUE(std::find(at.begin(), at.end(), per_epoch) != at.end()) << "an epoch's end";
    EXPECT_EQ(at.back(), 40) << "the last step";

    // c, going on from `saved`.
    const auto from = [&](const Saved& saved) {
      auto r = c;
      r.start_step = saved.steps_done;
      r.initial_params = saved.params;
      r.initial_buffers = saved.buffers;
      r.initial_optimizer_state = saved.state;
      r.initial_optimizer_steps = saved.optimizer_steps;
      return r;
    };
    const Saved& mid = checkpoints[2];  // after step 21: mid-epoch
    ASSERT_EQ(mid.steps_done, 21);
    const auto resumed = from(mid);
    std::vector<float> resumed_state;
    TrainHooks after;
    after.on_replica_step = [&](int rank, std::int64_t step, std::span<const float>, std::span<const float> s) {
      EXPECT_GE(step, 21);
      if (rank == 0 && step == 39) resumed_state.assign(s.begin(), s.end());
    };
    const auto r = train(resumed, data, after);
    EXPECT_EQ(r.steps, 40);
    EXPECT_EQ(r.resumed_from_step, 21);
    ASSERT_EQ(r.params.size(), whole.params.size());
    EXPECT_EQ(0, std::memcmp(r.params.data(), whole.params.data(), whole.params.size() * sizeof(float)));
    ASSERT_EQ(resumed_state.size(), final_state.size());
    EXPECT_EQ(0, std::memcmp(resumed_state.data(), final_state.data(), final_state.size() * sizeof(float)));
    // The final loss is the last progress window's, steps 33 to 40 (after
    // the epoch's end at 32), which the resumed run holds whole: the same.
    EXPECT_EQ(whole.final_loss_first_step, 33);
    EXPECT_EQ(whole.final_loss_last_step, 40);
    EXPECT_EQ(r.final_loss_first_step, 33);
    EXPECT_EQ(r.final_loss, whole.final_loss);
    // Resumed inside that window (after step 35), its window holds its own
    // steps only, and the summary says so.
    const auto late = std::find_if(checkpoints.begin(), checkpoints.end(), [](const Saved& s) { return s.steps_done == 35; });
    ASSERT_NE(late, checkpoints.end());
    const auto rl = train(from(*late), data);
    EXPECT_EQ(rl.final_loss_first_step, 36);
    EXPECT_EQ(rl.final_loss_last_step, 40);
    EXPECT_NE(summary_text(c, rl).find("(over steps 36 to 40: a resumed run's loss window starts at its first step)"),
              std::string::npos)
        << summary_text(c, rl);
    EXPECT_EQ(summary_text(c, r).find("a resumed run's loss window"), std::string::npos) << summary_text(c, r);
    // Resumed at a progress point (the epoch's end, after step 32), its window
    // begins at its first step as the unbroken run's does: the same loss, and
    // no note (it said the window started at the resumed run's first step, as
    // if cut short; found by resuming the CLI at a --log-every boundary).
    const auto at_end = std::find_if(checkpoints.begin(), checkpoints.end(),
                                     [&](const Saved& s) { return s.steps_done == per_epoch; });
    ASSERT_NE(at_end, checkpoints.end());
    const auto re = train(from(*at_end), data);
    EXPECT_EQ(re.final_loss_first_step, 33);
    EXPECT_EQ(re.final_loss, whole.final_loss);
    EXPECT_FALSE(re.final_loss_window_cut);
    EXPECT_TRUE(rl.final_loss_window_cut);
    EXPECT_EQ(summary_text(c, re).find("a resumed run's loss window"), std::string::npos) << summary_text(c, re);

    // From the last step's checkpoint (Note [A job that had ended]): no
    // step runs, and the run ends with the unbroken run's weights and their
    // test accuracy; its loss is not known.
    const auto ended = from(checkpoints.back());
    TrainHooks none;
    none.on_replica_step = [&](int, std::int64_t step, std::span<const float>, std::span<const float>) {
      ADD_FAILURE() << "step " << step << " ran";
    };
    const auto e = train(ended, data, none);
    EXPECT_EQ(e.steps, 40);
    EXPECT_EQ(e.resumed_from_step, 40);
    ASSERT_EQ(e.params.size(), whole.params.size());
    EXPECT_EQ(0, std::memcmp(e.params.data(), whole.params.data(), whole.params.size() * sizeof(float)));
    ASSERT_TRUE(whole.test_accuracy.has_value());
    EXPECT_EQ(e.test_accuracy, whole.test_accuracy);
    EXPECT_TRUE(std::isnan(e.final_loss)) << e.final_loss;
    // Nor the steps it would be over (they read 1 to 40 beside the NaN).
    EXPECT_EQ(e.final_loss_first_step, 0);
    EXPECT_EQ(e.final_loss_last_step, 0);
    EXPECT_EQ(e.samples_per_s, 0);
  }
}

// State the replicas hold differently goes into a checkpoint too, gathered
// from every replica: --zero 1's optimizer shards, --compress bf16's rounding
// errors, --bn-stats local's batch-norm statistics. Through the file
// (save_checkpoint, load_checkpoint, resume_from), a resumed run's last
// checkpoint is the unbroken run's, bit for bit, every replica's part of it
// included. Under --zero 1 the gathered state is also --zero 0's (the same
// arithmetic), so a shard lost or misplaced in the gather would show.
TEST(Resume, StateThatDiffersByReplicaResumesAsTheUnbrokenRun) {
  struct Saved {
    std::int64_t steps_done = 0, optimizer_steps = 0;
    std::vector<float> params, buffers, state, replica_buffers, error_feedback;
  };
  const auto keep = [](std::vector<Saved>& into) {
    return [&into](const Checkpoint& cp) {
      into.push_back({cp.steps_done,
                      cp.optimizer_steps,
                      {cp.params.begin(), cp.params.end()},
                      {cp.buffers.begin(), cp.buffers.end()},
                      {cp.optimizer_state.begin(), cp.optimizer_state.end()},
                      {cp.replica_buffers.begin(), cp.replica_buffers.end()},
                      {cp.error_feedback.begin(), cp.error_feedback.end()}});
    };
  };
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const auto path =
      std::filesystem::temp_directory_path() / ("lockstep_replica_state_" + std::to_string(::getpid()) + ".st");
  struct Case {
    const char* name;
    std::function<void(TrainConfig&)> set;
    bool cnn;
  };
  const std::vector<Case> cases = {
      {"--zero 1, sgd", [](TrainConfig& c) { c.zero = 1; }, false},
      {"--zero 1, adamw", [](TrainConfig& c) { c.zero = 1, c.optimizer = "adamw"; }, false},
      {"--compress bf16", [](TrainConfig& c) { c.compression = ddp::Compression::Bf16; }, false},
      {"cnn, --bn-stats local", [](TrainConfig& c) { c.bn_stats = BnStats::Local; }, true},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const auto data = k.cnn ? synthetic_data(512, 28 * 28) : synthetic_data(2048);
    auto c = small_config(4, k.cnn ? 4 : 16);
    c.steps = k.cnn ? 9 : 30;
    c.checkpoint_every = k.cnn ? 4 : 7;
    if (k.cnn) c.model = "cnn";
    k.set(c);
    std::vector<Saved> whole;
    TrainHooks hooks;
    hooks.on_checkpoint = keep(whole);
    train(c, data, hooks);
    ASSERT_GE(whole.size(), 2u);
    const Saved& mid = whole[1];
    const Saved& last = whole.back();
    ASSERT_EQ(last.steps_done, c.steps);
    const std::size_t P = last.params.size();
    if (c.zero == 1) {
      auto replicated = c;
      replicated.zero = 0;
      std::vector<Saved> plain;
      TrainHooks h;
      h.on_checkpoint = keep(plain);
      train(replicated, data, h);
      EXPECT_TRUE(same(last.state, plain.back().state)) << "the gathered shards are not --zero 0's state";
    }
    if (c.compression == ddp::Compression::Bf16) {
      ASSERT_EQ(last.error_feedback.size(), 4 * P);
      EXPECT_FALSE(std::equal(last.error_feedback.begin(), last.error_feedback.begin() + std::ptrdiff_t(P),
                              last.error_feedback.begin() + std::ptrdiff_t(P)))
          << "replicas 0 and 1 carry the same rounding error: not each its own";
    }
    if (k.cnn) {
      const std::size_t B = last.buffers.size();
      ASSERT_EQ(last.replica_buffers.size(), 4 * B);
      EXPECT_TRUE(std::equal(last.buffers.begin(), last.buffers.end(), last.replica_buffers.begin()));
      EXPECT_FALSE(std::equal(last.replica_buffers.begin(), last.replica_buffers.begin() + std::ptrdiff_t(B),
                              last.replica_buffers.begin() + std::ptrdiff_t(B)))
          << "replicas 0 and 1 hold the same statistics: not each its own";
    }

    // Written at mid.steps_done and read back, as --checkpoint and --resume do.
    const auto probe = make_model(c, data.train.features, data.train.num_classes);
    std::vector<std::string> slots = make_optimizer(c, P)->slot_names();
    save_checkpoint(path,
                    {.steps_done = mid.steps_done,
                     .steps_planned = c.steps,
                     .optimizer_steps = mid.optimizer_steps,
                     .layout = &probe->layout(),
                     .buffer_layout = &probe->buffer_layout(),
                     .slot_names = slots,
                     .params = mid.params,
                     .buffers = mid.buffers,
                     .optimizer_state = mid.state,
                     .replica_buffers = mid.replica_buffers,
                     .error_feedback = mid.error_feedback},
                    trajectory_fields(c, data), probe->describe());
    auto resumed = c;
    resume_from(resumed, data, load_checkpoint(path, c, data));
    std::vector<Saved> after;
    TrainHooks h;
    h.on_checkpoint = keep(after);
    train(resumed, data, h);
    ASSERT_FALSE(after.empty());
    const Saved& end = after.back();
    ASSERT_EQ(end.steps_done, c.steps);
    EXPECT_TRUE(same(end.params, last.params));
    EXPECT_TRUE(same(end.buffers, last.buffers));
    EXPECT_TRUE(same(end.state, last.state));
    EXPECT_TRUE(same(end.replica_buffers, last.replica_buffers));
    EXPECT_TRUE(same(end.error_feedback, last.error_feedback));

    // Without its per-replica part such a checkpoint cannot resume the run:
    // refused, not resumed with zeros.
    if (!mid.replica_buffers.empty() || !mid.error_feedback.empty()) {
      auto missing = resumed;
      missing.initial_replica_buffers = nullptr;
      missing.initial_error_feedback = nullptr;
      missing.initial_params = mid.params;
      missing.initial_optimizer_state = mid.state;
      EXPECT_THROW(train(missing, data), InvalidArgument);
    }
  }
  std::filesystem::remove(path);
}

// A checkpoint whose per-replica part is damaged is refused, naming what is
// wrong: a tensor missing from one replica's part, a stray tensor (in a
// replica's part, or of a replica past the others), or a replica's part
// missing whole (IoError, as for other damaged files).
TEST(Resume, ADamagedPerReplicaPartIsNamed) {
  const auto data = synthetic_data(512);
  auto c = small_config(2, 16);
  c.steps = 8;
  c.compression = ddp::Compression::Bf16;
  c.checkpoint_every = 4;
  const auto dir = std::filesystem::temp_directory_path() / ("lockstep_damaged_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  TrainHooks hooks;
  hooks.on_checkpoint = [&](const Checkpoint& cp) {
    if (cp.steps_done == 4) save_checkpoint(dir / "good.st", cp, trajectory_fields(c, data), "mlp");
  };
  train(c, data, hooks);
  const auto good = nn::load_safetensors(dir / "good.st");
  // `good` less the tensors `drop` names, plus a stray one if `stray` is given.
  const auto write = [&](const std::string& name, const std::function<bool(const std::string&)>& drop,
                         const std::string& stray = "") {
    std::vector<nn::TensorRef> refs;
    for (const auto& t : good.tensors)
      if (!drop(t.name)) refs.push_back({t.name, t.shape, t.data});
    const std::vector<float> one = {0.5f};
    if (!stray.empty()) refs.push_back({stray, {1}, one});
    nn::save_safetensors(dir / name, refs, good.metadata);
    return dir / name;
  };
  const auto refused = [&](const std::filesystem::path& path, const std::string& want) {
    try {
      auto resumed = c;
      resume_from(resumed, data, load_checkpoint(path, c, data));
      ADD_FAILURE() << path << " was accepted";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(write("one_missing.st", [](const std::string& n) { return n == "error_feedback.1.0.weight"; }),
          "tensor 'error_feedback.1.0.weight' [64, 48] is missing; each replica's part holds every tensor, so the "
          "file is damaged");
  refused(write("stray.st", [](const std::string&) { return false; }, "error_feedback.0.nope"),
          "tensor 'error_feedback.0.nope' does not belong to the per-replica state the file holds (replicas 0 to 1");
  refused(write("stray_replica.st", [](const std::string&) { return false; }, "error_feedback.7.0.bias"),
          "tensor 'error_feedback.7.0.bias' does not belong to the per-replica state the file holds (replicas 0 to 1, "
          "each with every parameter of the model); the file is damaged");
  refused(write("replica_gone.st", [](const std::string& n) { return n.rfind("error_feedback.1.", 0) == 0; }),
          "holds 'error_feedback.<r>.*' rounding errors for 1 replicas, but a run with --compress bf16 and 2 replicas "
          "keeps them for each, as the run that wrote it did; the file is damaged");
  auto plain = c;  // the same file is fine
  resume_from(plain, data, load_checkpoint(dir / "good.st", c, data));
  EXPECT_EQ(plain.initial_error_feedback->size(), 2 * plain.initial_params->size());
  std::filesystem::remove_all(dir);
}

// --resume names every setting that differs, each with both values, so that
// one run shows all there is to fix.
TEST(Resume, EverySettingThatDiffersIsNamed) {
  const auto data = synthetic_data(512);
  auto c = small_config(2, 16);
  LoadedCheckpoint cp;
  cp.steps_done = 1;
  cp.steps_planned = 20;
  cp.fields = trajectory_fields(c, data);
  auto other = c;
  other.lr = 0.05f;
  other.momentum = 0.5f;
  try {
    resume_from(other, data, cp);
    ADD_FAILURE() << "other settings were accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--resume: 2 settings differ from the run that wrote the checkpoint: "), std::string::npos)
        << what;
    EXPECT_NE(what.find("--lr ('0.1' there, '0.05' here)"), std::string::npos) << what;
    EXPECT_NE(what.find("--momentum ('0.9' there, '0.5' here)"), std::string::npos) << what;
  }
  auto one = c;
  one.lr = 0.05f;
  try {
    resume_from(one, data, cp);
    ADD_FAILURE() << "another --lr was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--resume: --lr differs from the run that wrote the checkpoint ('0.1' there, "
                                         "'0.05' here); a resumed run keeps"),
              std::string::npos)
        << e.what();
  }
}

// A checkpoint keeps rank 0's state as everyone's, so the replicas are
// compared at every step that writes one: a replica that diverged is caught
// there (stop) and never kept, though --check-every alone would compare
// only later. And a stop at an epoch's end, whose check has run already,
// counts no second accounting check.
TEST(Resume, ACheckpointIsOnlyOfStateTheReplicasAgreeOn) {
  const auto data = synthetic_data(2048);
  auto c = small_config(4, 16);
  c.steps = 40;
  c.check_every = 20;
  c.checkpoint_every = 10;
  c.inject = {fault_from_string("bitflip@8:0")};
  int written = 0;
  TrainHooks hooks;
  hooks.on_checkpoint = [&](const Checkpoint&) { ++written; };
  try {
    train(c, data, hooks);
    ADD_FAILURE() << "the flipped weight was not caught";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("replicas diverged by step 9"), std::string::npos) << e.what();
  }
  EXPECT_EQ(written, 0) << "a checkpoint kept the flipped weight";

  auto stop = small_config(4, 16);
  stop.steps = 100;
  stop.check_every = 0;
  const std::int64_t per_epoch = data.train.size / 64;
  stop.log_every = per_epoch;  // the first progress point is the first epoch's end
  stop.stop_poll_ms = 1e9;     // and the only vote after the first step's
  std::atomic<bool> ask{false};
  TrainHooks asked;
  asked.on_replica_step = [&](int, std::int64_t step, std::span<const float>, std::span<const float>) {
    if (step == per_epoch - 1) ask = true;
  };
  asked.stop_requested = [&] { return ask.load(); };
  const auto r = train(stop, data, asked);
  EXPECT_EQ(r.steps, per_epoch);
  EXPECT_EQ(r.accounting_checks, 1);
}

// With --algorithm auto the transport decides which all-reduce runs (and the
// last bits of its sums), so a checkpoint records it; an explicit algorithm
// sums alike everywhere.
TEST(Resume, TheTransportIsATrajectoryFieldOnlyUnderAuto) {
  const auto data = synthetic_data(512);
  auto c = small_config(2, 16);
  EXPECT_NE(trajectory_fields(c, data, "threads"), trajectory_fields(c, data, "gloo"));
  c.algorithm = comm::Algorithm::Ring;
  EXPECT_EQ(trajectory_fields(c, data, "threads"), trajectory_fields(c, data, "gloo"));
}

// A checkpoint holding a NaN (a damaged file) is refused when read, naming
// the tensor, instead of resuming into skipped steps.
TEST(Resume, ANonFiniteValueInACheckpointIsRefused) {
  const auto data = synthetic_data(512);
  auto c = small_config(2, 16);
  c.steps = 4;
  const auto path = std::filesystem::temp_directory_path() / ("lockstep_nan_" + std::to_string(::getpid()) + ".st");
  TrainHooks hooks;
  hooks.on_checkpoint = [&](const Checkpoint& cp) {
    if (cp.steps_done != 2) return;
    std::vector<float> state(cp.optimizer_state.begin(), cp.optimizer_state.end());
    state[3] = std::numeric_limits<float>::quiet_NaN();
    Checkpoint damaged = cp;
    damaged.optimizer_state = state;
    save_checkpoint(path, damaged, trajectory_fields(c, data), "mlp");
  };
  c.checkpoint_every = 2;
  train(c, data, hooks);
  try {
    load_checkpoint(path, c, data);
    ADD_FAILURE() << "a NaN in the optimizer state was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'optimizer.momentum_buffer.0.weight' holds NaN"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

// Note [Checkpoints in the background]: CheckpointWriter writes the bytes
// save_checkpoint writes in the step, and a write that fails is reported, by
// the next write() and by finish(). (Whether it writes its own copy, and not
// the arenas the run trains on, this cannot tell: a model this small is
// written before the next step changes them.)
TEST(Resume, TheBackgroundWriterWritesWhatTheStepHadAndReportsAFailure) {
  const auto data = synthetic_data(512);
  auto c = small_config(2, 16);
  c.steps = 12;
  c.compression = ddp::Compression::Bf16;  // per-replica parts too
  c.checkpoint_every = 4;
  const auto dir = std::filesystem::temp_directory_path() / ("lockstep_background_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto fields = trajectory_fields(c, data);
  CheckpointWriter writer(dir / "background.st", fields, "mlp");
  CheckpointWriter failing(dir / "no-such-dir" / "c.st", fields, "mlp");
  std::string next_write_error;
  TrainHooks hooks;
  hooks.on_checkpoint = [&](const Checkpoint& cp) {
    if (cp.steps_done == 8) {  // the next write reports the failed one, and starts none
      try {
        failing.write(cp);
      } catch (const IoError& e) {
        next_write_error = e.what();
      }
    }
    if (cp.steps_done != 4) return;
    save_checkpoint(dir / "in-step.st", cp, fields, "mlp");
    writer.write(cp);
    failing.write(cp);
  };
  train(c, data, hooks);
  // Reported at step 8, naming the write that failed.
  EXPECT_NE(next_write_error.find("no-such-dir"), std::string::npos) << next_write_error;
  EXPECT_NE(next_write_error.find("could not write the checkpoint of step 4"), std::string::npos) << next_write_error;
  writer.finish();
  const auto read = [&](const char* name) {
    std::ifstream in(dir / name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  ASSERT_FALSE(read("in-step.st").empty());
  EXPECT_EQ(read("background.st"), read("in-step.st")) << "the background write differs from the step's";
  failing.finish();  // reported once; nothing under way since

  CheckpointWriter unreported(dir / "no-such-dir" / "c.st", fields, "mlp");
  TrainHooks once;
  once.on_checkpoint = [&](const Checkpoint& cp) {
    if (cp.steps_done == 12) unreported.write(cp);
  };
  train(c, data, once);
  try {
    unreported.finish();
    ADD_FAILURE() << "a write into a missing directory was reported as done";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-dir"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// A start past the run's end or without the state is refused (a start at
// its end runs no step: FromACheckpointEndsAsTheUnbrokenRun).
TEST(Resume, AStartPastTheEndOrWithoutTheStateIsRefused) {
  const auto data = synthetic_data(512);
  auto past = small_config(2, 16);
  past.start_step = 21;  // the run has 20 steps
  try {
    train(past, data);
    ADD_FAILURE() << "a start past the end was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("start_step (--resume) is 21 of a run of 20 steps: past the run's last step"),
              std::string::npos)
        << e.what();
  }
  auto bare = small_config(2, 16);
  bare.start_step = 5;
  EXPECT_THROW(train(bare, data), InvalidArgument);
}

// The card: communication depends on the parameter count, not on the batch.
// Bytes are counted at the communicator, per replica.
TEST(Traffic, GradientBytesPerStepDoNotDependOnTheMicroBatch) {
  const auto data = synthetic_data(4096);
  // Ring: bytes counted message by message at the transport. Auto (shared
  // memory): what its writes and its peers' reads amount to.
  for (auto algorithm : {comm::Algorithm::Ring, comm::Algorithm::Auto}) {
    std::vector<std::uint64_t> per_step;
    for (std::int64_t micro : {8, 16, 32, 64, 128}) {
      auto c = small_config(8, micro);
      c.steps = 5;
      c.algorithm = algorithm;
      const auto r = train(c, data);
      for (const auto& t : r.traffic) {
        EXPECT_EQ(t.unaccounted, 0u) << "bytes sent that are neither init, gradients nor tallies";
        EXPECT_EQ(t.gradients % 5, 0u);
        // Ring: 2(N-1) chunks of ~P/N floats; chunk rounding moves it by < 2(N-1) floats.
        const double per = double(t.gradients) / 5;
        EXPECT_NEAR(per, double(r.allreduce_bytes_per_step_formula), 2.0 * 7 * 4);
        // The ring sends 2(N-1) messages per bucket; shared memory sends none.
        EXPECT_EQ(t.gradient_messages,
                  algorithm == comm::Algorithm::Ring ? 5u * r.buckets.size() * 2 * 7 : 0u);
      }
      per_step.push_back(r.traffic[0].gradients / 5);
      // Weights are sent once: what each replica sent before step 0 is at most
      // log2(N) copies of the weights (binomial-tree broadcast), and never 0 in all.
      std::uint64_t total_init = 0;
      for (const auto& t : r.traffic) total_init += t.init_broadcast;
      EXPECT_EQ(total_init, 7 * r.weight_bytes) << "each of 7 replicas receives the weights exactly once";
    }
    for (auto b : per_step) EXPECT_EQ(b, per_step[0]);
  }
}

TEST(Failure, OneReplicaThrowingStopsAllWithItsError) {
  const auto data = synthetic_data(2048);
  auto c = small_config(8, 16);
  c.timeout = std::chrono::seconds(5);
  TrainHooks hooks;
  hooks.on_replica_step = [](int rank, std::int64_t step, auto, auto) {
    if (rank == 3 && step == 2) throw IoError("injected failure on rank 3");
  };
  const auto start = std::chrono::steady_clock::now();
  try {
    train(c, data, hooks);
    FAIL() << "training should have failed";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure on rank 3"), std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "others were not woken";
}

// A data set built in code that disagrees with itself is refused before
// training, naming the set; before, a short `inputs` was read past its end.
TEST(Config, ADataSetThatDisagreesWithItselfIsRefused) {
  const auto expect_refused = [](const std::function<void(data::ImageClassificationData&)>& perturb,
                                 const std::string& says) {
    auto data = synthetic_data(300);
    perturb(data);
    try {
      train(small_config(2, 16), data);
      ADD_FAILURE() << "trained on a data set where " << says;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_refused([](auto& d) { d.train.inputs.resize(100); }, "the training set says 300 samples of");
  expect_refused([](auto& d) { d.train.labels.resize(299); }, "the training set says 300 samples, but it has 299 labels");
  expect_refused([](auto& d) { d.test.inputs.resize(d.test.inputs.size() - 1); }, "the test set says");
  expect_refused([](auto& d) { d.test.labels[3] = d.train.num_classes; }, "the test set's sample 3 has label");
  expect_refused([](auto& d) { d.train.labels[7] = -1; }, "the training set's sample 7 has label -1");
  expect_refused([](auto& d) { d.test.size = 0; }, "the test set is empty");
  expect_refused(
      [](auto& d) {
        d.test.features = d.train.features + 1;
        d.test.inputs.resize(static_cast<std::size_t>(d.test.size * d.test.features));
      },
      "features per sample and the training set");
}

// A program that evaluates on its own (evaluate = false) keeps no test set:
// an empty one trains, as nothing reads it; with evaluation it is refused.
// Before, an empty test set was refused whatever `evaluate` said.
TEST(Config, WithoutEvaluationAnEmptyTestSetTrains) {
  auto data = synthetic_data(300);
  data.test = {};
  auto c = small_config(2, 16);
  c.steps = 3;
  const TrainResult r = train(c, data);
  EXPECT_EQ(r.steps, 3);
  EXPECT_FALSE(r.test_accuracy.has_value());
  c.evaluate = true;
  try {
    train(c, data);
    ADD_FAILURE() << "evaluated on an empty test set";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the test set is empty"), std::string::npos) << e.what();
  }
}

// Starting weights or buffers with a NaN or an infinity are refused before
// training, naming the tensor: the run would otherwise end after max_skips
// steps of non-finite gradients, with no word of the weights.
TEST(Config, NonFiniteStartingStateIsRefusedNamingTheTensor) {
  const auto data = synthetic_data(300);
  auto c = small_config(2, 16);
  c.steps = 3;
  const auto model = make_model(c, data.train.features, data.train.num_classes);
  const auto& last = model->layout().tensors().back();
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto weights = std::vector<float>(model->params().begin(), model->params().end());
    weights[last.offset] = bad;
    c.initial_params = weights;
    try {
      train(c, data);
      ADD_FAILURE() << "trained from " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("initial_params: tensor " + last.name + " holds NaN or infinite"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("Give finite starting values, or leave it empty"), std::string::npos)
          << e.what();  // the remedy
    }
  }
  auto cnn = small_config(2, 4);
  cnn.model = "cnn";
  cnn.steps = 1;
  const auto cnn_data = synthetic_data(64, 28 * 28, 3, 8);
  const auto cnn_model = make_model(cnn, cnn_data.train.features, cnn_data.train.num_classes);
  auto buffers = std::vector<float>(cnn_model->buffers().begin(), cnn_model->buffers().end());
  buffers[0] = std::numeric_limits<float>::quiet_NaN();
  cnn.initial_buffers = buffers;
  EXPECT_THROW(train(cnn, cnn_data), InvalidArgument);
}

TEST(Config, ImpossibleValuesAreRefused) {
  const auto data = synthetic_data(300);
  auto zero = small_config(0, 32);
  EXPECT_THROW(train(zero, data), InvalidArgument);
  auto big = small_config(8, 64);  // 512 > 300 samples
  try {
    train(big, data);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("larger than the data set"), std::string::npos);
  }
  auto bad_init = small_config(2, 16);
  bad_init.initial_params = std::vector<float>(3, 0.0f);
  EXPECT_THROW(train(bad_init, data), InvalidArgument);
  // NaN hyper-parameters (NaN passes "< 0") and an accumulated batch past the data.
  for (auto perturb : std::vector<std::function<void(TrainConfig&)>>{
           [](TrainConfig& c) { c.momentum = std::numeric_limits<float>::quiet_NaN(); },
           [](TrainConfig& c) { c.weight_decay = std::numeric_limits<float>::quiet_NaN(); },
           [](TrainConfig& c) { c.momentum = 1.5f; }}) {
    auto c = small_config(2, 16);
    perturb(c);
    EXPECT_THROW(train(c, data), InvalidArgument);
  }
  auto accumulated = small_config(2, 16);
  accumulated.accumulate = 16;  // 2 x 16 x 16 = 512 > 300
  try {
    train(accumulated, data);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lower --accumulate"), std::string::npos) << e.what();
  }
}

TEST(Init, InitialParamsAreUsedAndBroadcast) {
  const auto data = synthetic_data(1024);
  auto c = small_config(4, 16);
  c.steps = 1;
  c.lr = 1e-30f;  // the step changes (almost) nothing
  auto first = train(c, data);
  auto from_file = first.params;
  for (auto& v : from_file) v *= 0.5f;
  c.initial_params = from_file;
  auto second = train(c, data);
  EXPECT_LT(max_abs_diff(second.params, from_file), 1e-20f);
}

}  // namespace
}  // namespace lockstep::train
