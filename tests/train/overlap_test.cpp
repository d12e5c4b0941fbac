// The reducer in the trainer: accumulation, ragged policies, overlap on a
// modelled link, the timeline and the per-step metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "lockstep/error.h"
#include "lockstep/train/report.h"
#include "lockstep/train/trainer.h"
#include "synthetic_data.h"
#include "train/replica.h"

namespace lockstep::train {
namespace {

using testing::max_abs_diff;
using testing::synthetic_data;

TrainConfig config(int replicas, std::int64_t micro_batch) {
  TrainConfig c;
  c.replicas = replicas;
  c.micro_batch = micro_batch;
  c.hidden = {64, 32};
  c.steps = 10;
  c.evaluate = false;
  c.timeout = std::chrono::seconds(20);
  return c;
}

// K micro-steps of 16 accumulate the gradient of the same 64 samples that one
// micro-step of 64 sees: the same update up to float reassociation
// (tolerance as in trainer_test: 2e-6 on weights of O(0.1) after 10 steps).
TEST(Accumulate, FourMicroStepsOfSixteenEqualOneStepOfSixtyFour) {
  const auto data = synthetic_data(4096);
  auto one = config(4, 64);
  auto four = config(4, 16);
  four.accumulate = 4;
  const auto a = train(one, data);
  const auto b = train(four, data);
  EXPECT_EQ(b.global_batch, 4 * 16 * 4);
  EXPECT_EQ(a.global_batch, b.global_batch);
  EXPECT_LT(max_abs_diff(a.params, b.params), 2e-6f);
  EXPECT_NEAR(a.final_loss, b.final_loss, 1e-4);
  // One all-reduce per optimizer step, not per micro-step.
  EXPECT_EQ(a.traffic[0].gradients, b.traffic[0].gradients);
}

// 1003 samples at 8 x 32: each epoch ends with a batch of 235 (29/30 per replica).
TEST(Ragged, PadAndWeightedBothGiveTheExactMeanAndDropSkipsTheBatch) {
  const auto data = synthetic_data(1003);
  std::map<Ragged, TrainResult> runs;
  std::map<Ragged, TrainConfig> configs;
  for (auto policy : {Ragged::Weighted, Ragged::Pad, Ragged::Drop}) {
    auto c = config(8, 32);
    c.steps = 0;
    c.epochs = 2;
    c.ragged = policy;
    configs[policy] = c;
    runs[policy] = train(c, data);
  }
  auto whole = config(1, 256);
  whole.steps = 0;
  whole.epochs = 2;
  const auto reference = train(whole, data);
  EXPECT_EQ(runs[Ragged::Weighted].steps, 8);
  EXPECT_EQ(runs[Ragged::Pad].steps, 8);
  EXPECT_EQ(runs[Ragged::Drop].steps, 6);  // floor(1003 / 256) per epoch
  // The summary's account of the partial step: 235 samples, shards of 29 to 30.
  for (auto policy : {Ragged::Weighted, Ragged::Pad}) {
    EXPECT_EQ(runs[policy].last_step_samples, 235);
    EXPECT_EQ(runs[policy].last_step_min_shard, 29);
    EXPECT_EQ(runs[policy].last_step_max_shard, 30);
  }
  EXPECT_EQ(runs[Ragged::Drop].last_step_samples, 0);
  // What drop left out is said too: the summary was silent about it, and
  // showed only fewer samples read.
  EXPECT_EQ(runs[Ragged::Drop].samples_dropped_per_epoch, 235);
  EXPECT_NE(summary_text(configs[Ragged::Drop], runs[Ragged::Drop])
                .find("an epoch's last 235 samples are dropped (--ragged drop); 1536 samples read in all"),
            std::string::npos)
      << summary_text(configs[Ragged::Drop], runs[Ragged::Drop]);
  for (auto policy : {Ragged::Weighted, Ragged::Pad}) EXPECT_EQ(runs[policy].samples_dropped_per_epoch, 0);
  auto short_run = config(8, 32);
  short_run.steps = 2;  // ends before the epoch's last step
  const auto short_result = train(short_run, data);
  EXPECT_EQ(short_result.last_step_samples, 0);
  EXPECT_EQ(short_result.samples_dropped_per_epoch, 0);
  EXPECT_LT(max_abs_diff(runs[Ragged::Weighted].params, reference.params), 2e-6f);
  EXPECT_LT(max_abs_diff(runs[Ragged::Pad].params, reference.params), 2e-6f);
  EXPECT_GT(max_abs_diff(runs[Ragged::Drop].params, reference.params), 1e-4f)
      << "drop must not see those samples";
}

// With batch norm (--model cnn) too: the padding rows take no part in the
// batch statistics, so pad and weighted train the same weights and running
// statistics. Before, the zero rows entered every replica's mean and
// variance (weights 3.8e-3 apart).
TEST(Ragged, PadLeavesThePaddingOutOfBatchNormStatistics) {
  const auto data = synthetic_data(300, 784);  // 28 x 28; the last batch of 44 gives shards of 5 and 6
  std::map<Ragged, TrainResult> runs;
  for (auto policy : {Ragged::Weighted, Ragged::Pad}) {
    auto c = config(8, 16);
    c.model = "cnn";
    c.steps = 0;
    c.epochs = 1;
    c.shuffle = false;
    c.ragged = policy;
    runs[policy] = train(c, data);
  }
  ASSERT_EQ(runs[Ragged::Pad].last_step_samples, 44);
  EXPECT_LT(max_abs_diff(runs[Ragged::Pad].params, runs[Ragged::Weighted].params), 1e-5f);
  EXPECT_LT(max_abs_diff(runs[Ragged::Pad].buffers, runs[Ragged::Weighted].buffers), 1e-5f);
}

// Events of one replica in one step.
std::vector<const TimelineEvent*> events_of(const TrainResult& r, int replica, std::int64_t step) {
  std::vector<const TimelineEvent*> out;
  for (const auto& e : r.timeline)
    if (e.replica == replica && e.step == step) out.push_back(&e);
  return out;
}

// Whether some bucket's all-reduce on `replica` started before its backward ended, per step.
std::vector<bool> overlapped_steps(const TrainResult& r, int replica) {
  std::vector<bool> out;
  for (std::int64_t s = 0; s < r.steps; ++s) {
    double backward_end = 0, first_comm = 1e300;
    for (const auto* e : events_of(r, replica, s)) {
      if (e->phase == Phase::Backward) backward_end = std::max(backward_end, e->end_us);
      if (e->phase == Phase::Allreduce) first_comm = std::min(first_comm, e->start_us);
    }
    out.push_back(first_comm < backward_end);
  }
  return out;
}

// The card: the all-reduce of the last layers' bucket runs while backward
// still works on the first layers. On a slow modelled link, the first
// bucket (the last layer) starts before the first layer's backward ends;
// with one bucket it never can.
TEST(Overlap, ABucketsAllreduceStartsBeforeBackwardEnds) {
  // The window to overlap in is the backward of the layers before the last:
  // tens of ms at this width, so a comm thread that a loaded machine
  // schedules late still starts inside it (at width 256 it was ~3 ms, and a
  // CI run on a busy machine missed it in all six steps).
  const auto data = synthetic_data(2048, /*features=*/784);
  auto c = config(2, 128);
  c.hidden = {1024, 1024};
  c.steps = 6;
  c.link = {.bytes_per_second = 125e6, .latency = std::chrono::microseconds(50)};  // 1 Gbit/s
  c.first_bucket_mb = 0.03;  // the last Linear (41 KB) alone
  c.bucket_mb = 0.2;
  c.record_timeline = true;
  const auto bucketed = train(c, data);
  ASSERT_GE(bucketed.buckets.size(), 3u);
  for (int r = 0; r < 2; ++r) {
    const auto steps = overlapped_steps(bucketed, r);
    EXPECT_GE(std::count(steps.begin(), steps.end(), true), 1) << "replica " << r << " never overlapped";
  }
  c.bucket_mb = 0;
  const auto single = train(c, data);
  ASSERT_EQ(single.buckets.size(), 1u);
  for (int r = 0; r < 2; ++r) {
    const auto steps = overlapped_steps(single, r);
    EXPECT_EQ(std::count(steps.begin(), steps.end(), true), 0)
        << "one bucket cannot start before backward ends";
  }
  EXPECT_GT(single.times.exposed_comm_ms, 0.0);
  EXPECT_EQ(single.times.overlap_fraction, 0.0);
}

TEST(Timeline, EveryReplicaRecordsEveryPhaseOfEveryStep) {
  const auto data = synthetic_data(1024);
  auto c = config(3, 16);
  c.steps = 4;
  c.first_bucket_mb = 0.001;
  c.bucket_mb = 0.004;
  c.record_timeline = true;
  const auto r = train(c, data);
  const std::size_t layers = 5;  // Linear ReLU Linear ReLU Linear
  ASSERT_GE(r.buckets.size(), 2u);
  for (int replica = 0; replica < 3; ++replica) {
    for (std::int64_t s = 0; s < 4; ++s) {
      std::map<Phase, std::size_t> count;
      for (const auto* e : events_of(r, replica, s)) {
        ++count[e->phase];
        EXPECT_LE(e->start_us, e->end_us);
        EXPECT_EQ(e->track == Track::Comm, e->phase == Phase::Allreduce);
        if (e->phase == Phase::Allreduce) {
          EXPECT_GT(e->bytes, 0u);
        }
      }
      EXPECT_EQ(count[Phase::Forward], layers + 1) << "a forward event per layer, and the loss";
      EXPECT_EQ(count[Phase::Backward], layers);
      EXPECT_EQ(count[Phase::Allreduce], r.buckets.size());
      EXPECT_EQ(count[Phase::Optimizer], 1u);
    }
  }
  // Without asking, nothing is kept.
  c.record_timeline = false;
  EXPECT_TRUE(train(c, data).timeline.empty());
}

// Exposed communication ends when the step's last all-reduce ends. With the
// all-reduces on a communication thread and more replicas than cores, the
// replica's own thread may run again only later; that wait is the OS running
// other replicas, and the exposed span used to include it (a learner's
// review saw it run up to 36 ms past the communication lane's end).
TEST(Timeline, ExposedCommunicationEndsWithTheLastAllreduce) {
  const auto data = synthetic_data(1024);
  auto c = config(8, 16);
  c.steps = 6;
  c.first_bucket_mb = 0.001;
  c.bucket_mb = 0.004;
  c.overlap = Overlap::On;
  c.record_timeline = true;
  const auto r = train(c, data);
  int exposed_spans = 0;
  for (int replica = 0; replica < 8; ++replica) {
    for (std::int64_t s = 0; s < c.steps; ++s) {
      double comm_end = 0, backward_end = 0, optimizer_start = 1e300;
      const TimelineEvent* exposed = nullptr;
      for (const auto* e : events_of(r, replica, s)) {
        if (e->phase == Phase::Allreduce) comm_end = std::max(comm_end, e->end_us);
        if (e->phase == Phase::Backward) backward_end = std::max(backward_end, e->end_us);
        if (e->phase == Phase::Optimizer) optimizer_start = std::min(optimizer_start, e->start_us);
        if (e->phase == Phase::Exposed) exposed = e;
      }
      if (comm_end > backward_end) {
        ASSERT_NE(exposed, nullptr) << "replica " << replica << " step " << s;
        ++exposed_spans;
        EXPECT_EQ(exposed->start_us, backward_end) << "replica " << replica << " step " << s;
        EXPECT_EQ(exposed->end_us, comm_end) << "replica " << replica << " step " << s;
      } else {
        EXPECT_EQ(exposed, nullptr) << "replica " << replica << " step " << s;
      }
      EXPECT_GE(optimizer_start, comm_end) << "replica " << replica << " step " << s;
    }
  }
  EXPECT_GT(exposed_spans, 0);
}

// --deterministic sums a replica's atoms (AtomTree) after backward and only
// then all-reduces the total: the summing is compute, so the step waits on
// communication exactly while the tree all-reduce runs. The exposed span used
// to start at the end of backward and count the atoms' summation as
// communication (exposed > comm on every step, seen in a review's --report).
TEST(Timeline, DeterministicExposedCommunicationIsTheTreeAllreduce) {
  const auto data = synthetic_data(1024);
  auto c = config(2, 32);
  c.steps = 3;
  c.deterministic = true;
  c.atom = 8;  // 4 atoms a replica: three additions of the whole gradient before the all-reduce
  c.record_timeline = true;
  const auto r = train(c, data);
  for (int replica = 0; replica < 2; ++replica) {
    for (std::int64_t s = 0; s < c.steps; ++s) {
      const TimelineEvent *exposed = nullptr, *allreduce = nullptr;
      for (const auto* e : events_of(r, replica, s)) {
        if (e->phase == Phase::Exposed) exposed = e;
        if (e->phase == Phase::Allreduce) allreduce = e;
      }
      ASSERT_NE(allreduce, nullptr) << "replica " << replica << " step " << s;
      ASSERT_NE(exposed, nullptr) << "replica " << replica << " step " << s;
      EXPECT_EQ(exposed->start_us, allreduce->start_us) << "replica " << replica << " step " << s;
      EXPECT_EQ(exposed->end_us, allreduce->end_us) << "replica " << replica << " step " << s;
    }
  }
  // The same spans, so every step's exposed time is its communication time.
  EXPECT_EQ(r.times.exposed_comm_ms, r.times.comm_ms);
  EXPECT_EQ(r.times.overlap_fraction, 0.0);
}

TEST(Metrics, StepTimesAreConsistent) {
  const auto data = synthetic_data(1024);
  const auto r = train(config(4, 16), data);
  EXPECT_GT(r.times.step_ms, 0.0);
  EXPECT_GT(r.times.compute_ms, 0.0);
  EXPECT_GT(r.times.comm_ms, 0.0);
  EXPECT_GE(r.times.exposed_comm_ms, 0.0);
  EXPECT_LE(r.times.exposed_comm_ms, r.times.step_ms);
  EXPECT_GE(r.times.overlap_fraction, 0.0);
  EXPECT_LE(r.times.overlap_fraction, 1.0);
  // Each step's wait and joined parts sum to its comm, so their medians
  // cannot exceed comm's.
  ASSERT_FALSE(std::isnan(r.times.comm_wait_ms)) << "every replica ran in this process";
  EXPECT_GE(r.times.comm_wait_ms, 0.0);
  EXPECT_LE(r.times.comm_wait_ms, r.times.comm_ms);
  EXPECT_GE(r.times.comm_joined_ms, 0.0);
  EXPECT_LE(r.times.comm_joined_ms, r.times.comm_ms);
}

// Note [Waiting for the last replica] on hand-made spans: three replicas, one
// step, two all-reduces. The wait is the time to the last replica's start,
// clamped to the replica's own span.
TEST(Metrics, WaitIsTheTimeToTheLastReplicasStart) {
  using std::chrono::milliseconds;
  const auto t0 = std::chrono::steady_clock::now();
  auto at = [&](int ms) { return t0 + milliseconds(ms); };
  // {start, end} of all-reduce 0 and 1 on each replica.
  const int spans[3][2][2] = {{{0, 7}, {8, 10}}, {{2, 7}, {8, 10}}, {{5, 7}, {9, 10}}};
  std::vector<detail::ReplicaOutput> outputs(3);
  for (int r = 0; r < 3; ++r) {
    detail::StepSample s;
    for (const auto& span : spans[r]) {
      s.spans.emplace_back(at(span[0]), at(span[1]));
      s.comm += span[1] - span[0];
    }
    outputs[r].steps.push_back(s);
  }
  detail::attribute_waits(outputs);
  EXPECT_NEAR(outputs[0].steps[0].comm_wait, 5 + 1, 1e-9);
  EXPECT_NEAR(outputs[1].steps[0].comm_wait, 3 + 1, 1e-9);
  EXPECT_NEAR(outputs[2].steps[0].comm_wait, 0, 1e-9);
  std::vector<detail::StepSample> all;
  for (const auto& o : outputs) all.push_back(o.steps[0]);
  const auto t = detail::median_times(all);
  EXPECT_NEAR(t.comm_wait_ms, 4, 1e-9);
  EXPECT_NEAR(t.comm_joined_ms, 3, 1e-9);  // comm 9, 7, 3 minus waits 6, 4, 0

  // A span that ends before the last start (it cannot, but the sum must stay
  // within comm) waits its whole span.
  outputs[0].steps[0].spans[0] = {at(0), at(1)};
  detail::attribute_waits(outputs);
  EXPECT_NEAR(outputs[0].steps[0].comm_wait, 1 + 1, 1e-9);

  // Spans that do not line up (a replica with one all-reduce fewer) are left
  // unattributed rather than paired wrongly.
  for (auto& o : outputs) o.steps[0].comm_wait = std::numeric_limits<double>::quiet_NaN();
  outputs[2].steps[0].spans.pop_back();
  detail::attribute_waits(outputs);
  for (const auto& o : outputs) EXPECT_TRUE(std::isnan(o.steps[0].comm_wait));
}

// bf16 on the wire: half the gradient bytes of the float ring, and training
// still follows the exact path closely.
TEST(Compression, Bf16HalvesGradientBytesAndStillTrains) {
  const auto data = synthetic_data(2048);
  auto exact = config(4, 32);
  exact.algorithm = comm::Algorithm::Ring;
  auto bf16 = exact;
  bf16.compression = ddp::Compression::Bf16;
  const auto a = train(exact, data);
  const auto b = train(bf16, data);
  EXPECT_EQ(2 * b.traffic[0].gradients, a.traffic[0].gradients);
  EXPECT_EQ(2 * b.allreduce_bytes_per_step_formula, a.allreduce_bytes_per_step_formula);
  EXPECT_NEAR(a.final_loss, b.final_loss, 0.02 * a.final_loss);
  EXPECT_GT(max_abs_diff(a.params, b.params), 0.0f) << "the compressed path must differ somewhere";
  EXPECT_LT(max_abs_diff(a.params, b.params), 5e-3f);
}

TEST(Config, NewFlagsAreValidated) {
  const auto data = synthetic_data(1024);
  auto c = config(2, 16);
  c.compression = ddp::Compression::Bf16;  // bf16 runs its own ring: another algorithm would be ignored
  c.algorithm = comm::Algorithm::HalvingDoubling;
  EXPECT_THROW(train(c, data), InvalidArgument);
  c = config(2, 16);
  c.inject = {fault_from_string("nan@500:0")};  // past the last step: the fault would never happen
  EXPECT_THROW(train(c, data), InvalidArgument);
  c = config(2, 16);
  c.accumulate = 0;
  EXPECT_THROW(train(c, data), InvalidArgument);
  c = config(2, 16);
  c.bucket_mb = -1;
  EXPECT_THROW(train(c, data), InvalidArgument);
  c = config(2, 16);
  c.bucket_mb = 1e-7;  // under a byte: it ran as 0, one bucket after backward
  EXPECT_THROW(train(c, data), InvalidArgument);
  c = config(2, 16);
  c.link.latency = std::chrono::microseconds(10);
  c.algorithm = comm::Algorithm::SharedMemory;
  EXPECT_THROW(train(c, data), InvalidArgument);
  EXPECT_THROW(ragged_from_string("mean"), InvalidArgument);
  EXPECT_EQ(ragged_from_string("pad"), Ragged::Pad);
}

}  // namespace
}  // namespace lockstep::train

namespace lockstep::train {
namespace {

// The CNN (batch norm, dropout keyed by global sample index) in lockstep:
// parameters identical on every replica after every step, and it learns.
TEST(Cnn, ReplicasStayIdenticalAndTheLossFalls) {
  const auto data = synthetic_data(1024, /*features=*/784);
  auto c = config(4, 8);
  c.model = "cnn";
  c.steps = 12;
  c.lr = 0.05f;
  c.log_every = 1;
  std::vector<std::vector<float>> last(4);
  std::mutex mu;
  std::vector<double> losses;
  TrainHooks hooks;
  hooks.on_replica_step = [&](int rank, std::int64_t, std::span<const float> p, std::span<const float>) {
    std::lock_guard lock(mu);
    last[rank].assign(p.begin(), p.end());
  };
  hooks.on_progress = [&](const Progress& p) { losses.push_back(p.loss); };
  const auto r = train(c, data, hooks);
  EXPECT_EQ(r.param_count, 207018u);
  for (int rank = 1; rank < 4; ++rank) EXPECT_EQ(last[rank], last[0]) << "rank " << rank;
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), losses.front());
  auto bad = config(2, 8);
  bad.model = "cnn";
  EXPECT_THROW(train(bad, synthetic_data(256)), InvalidArgument);  // 48 features are not 28x28
  // 784 values in another shape are not 28x28 images either; one channel of 28x28 is.
  auto wide = synthetic_data(256, 28 * 28);
  wide.train.shape = wide.test.shape = {14, 56};
  bad.steps = 1;
  try {
    train(bad, wide);
    ADD_FAILURE() << "a 14x56 data set trained a 28x28 CNN";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("784 values per sample (14x56)"), std::string::npos) << e.what();
  }
  auto channel = synthetic_data(256, 28 * 28);
  channel.train.shape = channel.test.shape = {1, 28, 28};
  EXPECT_NO_THROW(train(bad, channel));
}

}  // namespace
}  // namespace lockstep::train
