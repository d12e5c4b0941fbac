// --zero 1 (sharded optimizer state) end to end: the same weights, bit for
// bit, as replicated training on every path; each replica holds only its
// shard; the bytes of one all-reduce; and the guards still hold.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "lockstep/error.h"
#include "lockstep/train/trainer.h"
#include "synthetic_data.h"
#include "train_helpers.h"

namespace lockstep::train {
namespace {

using testing::bucketed_config;
using testing::expect_refused;
using testing::same_bits;
using testing::synthetic_data;

TrainConfig zero_config(int replicas, const char* optimizer = "sgd") {
  TrainConfig c = bucketed_config(replicas);
  c.optimizer = optimizer;
  c.lr = c.optimizer == "adamw" ? 1e-3f : 0.1f;
  return c;
}

// Each element's update is the same arithmetic on the same mean gradient
// (the reduce-scatter's chunks are the all-reduce's bits), so sharding
// changes nothing in the weights: on shared memory and on the ring, with
// replica counts that cut the buckets unevenly, SGD and AdamW, and an
// epoch's ragged last batch (1003 samples).
TEST(Zero, ShardedTrainingGivesTheReplicatedWeightsBitForBit) {
  const auto data = synthetic_data(1003);
  for (const char* opt : {"sgd", "adamw"}) {
    for (auto algorithm : {comm::Algorithm::Auto, comm::Algorithm::Ring}) {
      for (int n : {3, 8}) {
        auto replicated = zero_config(n, opt);
        replicated.algorithm = algorithm;
        replicated.steps = 0;
        replicated.epochs = 2;  // 1003 / (n x 16): each epoch ends with a ragged batch
        auto sharded = replicated;
        sharded.zero = 1;
        const auto a = train(replicated, data);
        const auto b = train(sharded, data);
        ASSERT_GT(a.buckets.size(), 2u);
        if (algorithm == comm::Algorithm::Auto &&
            n == 8) {  // the shared-memory halves on the reducer's thread
          auto overlapped = sharded;
          overlapped.overlap = Overlap::On;
          EXPECT_TRUE(same_bits(a.params, train(overlapped, data).params)) << opt << " overlap on";
        }
        EXPECT_TRUE(same_bits(a.params, b.params)) << opt << " " << comm::to_string(algorithm) << " n=" << n;
        EXPECT_EQ(a.final_loss, b.final_loss);
        EXPECT_EQ(b.zero, 1);
      }
    }
  }
}

// The reducer's communication thread reduce-scatters buckets during
// backward over a modelled link, as it all-reduces them.
TEST(Zero, OverlappedOverAModelledLinkToo) {
  const auto data = synthetic_data(1024);
  auto replicated = zero_config(4);
  replicated.overlap = Overlap::On;
  replicated.algorithm =
      comm::Algorithm::Ring;  // auto takes halving-doubling for buckets this small: other sums
  replicated.link.bytes_per_second = 10e9;
  replicated.link.latency = std::chrono::microseconds(5);
  auto sharded = replicated;
  sharded.zero = 1;
  const auto a = train(replicated, data);
  const auto b = train(sharded, data);
  EXPECT_TRUE(b.overlapped);
  EXPECT_TRUE(same_bits(a.params, b.params));
}

// Each replica's optimizer state is its own 1/N (the shards together are the
// whole), its weights are everyone's after every step, and a step sends what
// one all-reduce sends: the gradients' reduce-scatter plus the weights'
// all-gather (the shared-memory path counts exactly, without fingerprints).
TEST(Zero, EachReplicaHoldsItsShardAndSendsWhatAnAllreduceSends) {
  const auto data = synthetic_data(1024);
  auto sharded = zero_config(4, "adamw");
  sharded.zero = 1;
  std::mutex mu;
  std::map<std::int64_t, std::map<int, std::vector<float>>> weights;
  std::map<int, std::size_t> state_floats;
  TrainHooks hooks;
  hooks.on_replica_step = [&](int rank, std::int64_t step, std::span<const float> p,
                              std::span<const float> s) {
    std::lock_guard lock(mu);
    weights[step][rank].assign(p.begin(), p.end());
    state_floats[rank] = s.size();
  };
  const auto b = train(sharded, data, hooks);
  const std::size_t params = b.layout.numel();
  std::size_t total = 0;
  for (const auto& [rank, floats] : state_floats) {
    EXPECT_LE(floats, 2 * (params / 4 + b.buckets.size())) << "rank " << rank;  // exp_avg and exp_avg_sq
    total += floats;
  }
  EXPECT_EQ(total, 2 * params);
  EXPECT_EQ(b.optimizer_state_bytes_whole, 2 * params * sizeof(float));
  EXPECT_LE(b.optimizer_state_bytes,
            b.optimizer_state_bytes_whole / 4 + 2 * b.buckets.size() * sizeof(float));
  for (const auto& [step, ranks] : weights)
    for (const auto& [rank, w] : ranks)
      EXPECT_TRUE(same_bits(w, ranks.at(0))) << "step " << step << " rank " << rank;

  auto replicated = sharded;
  replicated.zero = 0;
  const auto a = train(replicated, data);
  // Per rank the two split a bucket's uneven chunks differently (the
  // all-reduce's rank r computes chunk r, the shard is chunk r+1), so the
  // group's totals are compared.
  std::uint64_t replicated_bytes = 0, sharded_bytes = 0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(a.traffic[r].weights, 0u);
    EXPECT_GT(b.traffic[r].weights, 0u);
    EXPECT_EQ(b.traffic[r].unaccounted, 0u);
    replicated_bytes += a.traffic[r].gradients;
    sharded_bytes += b.traffic[r].gradients + b.traffic[r].weights;
  }
  EXPECT_EQ(sharded_bytes, replicated_bytes);
}

// Note [Non-finite sentinel], sharded: a NaN on rank 2 reaches every rank's
// own chunk, so all skip the step together and stay identical.
TEST(Zero, ANonFiniteGradientIsSkippedByEveryReplica) {
  for (auto algorithm : {comm::Algorithm::Auto, comm::Algorithm::Ring}) {
    SCOPED_TRACE(comm::to_string(algorithm));
    auto c = zero_config(4);
    c.zero = 1;
    c.algorithm = algorithm;
    c.inject = {fault_from_string("nan@4:2")};
    std::mutex mu;
    std::map<std::int64_t, std::map<int, std::vector<float>>> weights;
    TrainHooks hooks;
    hooks.on_replica_step = [&](int rank, std::int64_t step, std::span<const float> p,
                                std::span<const float>) {
      std::lock_guard lock(mu);
      weights[step][rank].assign(p.begin(), p.end());
    };
    const auto r = train(c, synthetic_data(1024), hooks);
    ASSERT_EQ(r.skipped.size(), 1u);
    EXPECT_EQ(r.skipped[0].step, 4);
    EXPECT_EQ(r.skipped[0].ranks, std::vector<int>{2});
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_TRUE(same_bits(weights[4][rank], weights[3][rank]))
          << "rank " << rank << " applied the skipped step";
      EXPECT_FALSE(same_bits(weights[5][rank], weights[4][rank])) << "rank " << rank << " did not go on";
      EXPECT_TRUE(same_bits(weights[11][rank], weights[11][0]));
    }
  }
}

// The trade (docs/design.md, "Sharded optimizer state"): every step's
// all-gather hands each replica every owner's weights, so a flipped weight
// is overwritten by its owner's (when another rank owns it) or becomes
// everyone's (when the flipping rank does): only a check in the flip's own
// step can see it. There it is caught and named; anywhere else the fault is
// refused, as other faults no guard could see.
TEST(Zero, AFlippedWeightIsSeenOnlyInItsOwnStep) {
  auto c = zero_config(5);
  c.zero = 1;
  c.check_every = 4;
  c.inject = {fault_from_string("bitflip@7:3")};  // step 7 is checked
  try {
    train(c, synthetic_data(1024));
    ADD_FAILURE() << "the flip went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("replicas diverged by step 7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("on rank 3 differs"), std::string::npos) << e.what();
  }
  c.inject = {fault_from_string("bitflip@5:3")};  // the next check is at step 7: too late
  EXPECT_THROW(train(c, synthetic_data(1024)), InvalidArgument);
}

// --deterministic all-reduces the gradients in its tree, then the update
// is sharded: still one set of bits for any power-of-two replica count.
TEST(Zero, DeterministicStaysBitExactForAnyReplicaCount) {
  const auto data = synthetic_data(1024);
  auto one = zero_config(1);
  one.micro_batch = 64;
  one.deterministic = true;
  one.atom = 8;
  const auto first = train(one, data).params;
  for (int n : {2, 4}) {
    auto c = one;
    c.replicas = n;
    c.micro_batch = 64 / n;
    c.zero = 1;
    EXPECT_TRUE(same_bits(train(c, data).params, first)) << "n=" << n;
  }
}

TEST(Zero, RefusesWhatItCannotShard) {
  const auto data = synthetic_data(1024);
  auto c = zero_config(1);
  c.zero = 1;
  expect_refused(c, data, "one replica has nothing to shard with");
  c = zero_config(4);
  c.zero = 2;
  expect_refused(c, data, "stages 2 and 3 are not trained, but every lockstep plan prices them");
  c.zero = -1;
  expect_refused(c, data, "--zero -1: lockstep trains with stage 0 (replicated) or 1 (sharded optimizer state).");
  c.zero = 1;
  c.compression = ddp::Compression::Bf16;
  expect_refused(c, data, "--compress bf16 cannot be combined");
  c.compression = ddp::Compression::None;
  c.algorithm = comm::Algorithm::HalvingDoubling;
  expect_refused(c, data, "--algorithm halving_doubling would be ignored");
}

}  // namespace
}  // namespace lockstep::train
