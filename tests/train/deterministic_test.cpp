// --deterministic: bitwise-identical weights, optimizer state, buffers and
// loss for 1, 2, 4 and 8 replicas on the same global batch (Note [Bit-exact
// for any replica count], src/train/atoms.h).
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>

#include "lockstep/error.h"
#include "lockstep/train/trainer.h"
#include "synthetic_data.h"
#include "user_models.h"

namespace lockstep::train {
namespace {

using testing::synthetic_data;

struct Final {
  std::vector<float> params, state, buffers;
  double loss = 0;
  bool operator==(const Final& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    return same(params, o.params) && same(state, o.state) && same(buffers, o.buffers) &&
           std::memcmp(&loss, &o.loss, sizeof loss) == 0;
  }
};

Final run(TrainConfig c, const data::ImageClassificationData& data) {
  Final f;
  std::mutex mu;
  TrainHooks hooks;
  hooks.on_replica_step = [&](int rank, std::int64_t step, std::span<const float>, std::span<const float> s) {
    if (rank != 0 || step != c.steps - 1) return;
    std::lock_guard lock(mu);
    f.state.assign(s.begin(), s.end());
  };
  const auto r = train(c, data, hooks);
  f.params = r.params;
  f.buffers = r.buffers;
  f.loss = r.final_loss;
  return f;
}

TrainConfig config(const std::string& model, const std::string& optimizer) {
  TrainConfig c;
  c.model = model;
  c.optimizer = optimizer;
  c.lr = optimizer == "adamw" ? 0.003f : 0.05f;
  c.hidden = {32, 16};
  c.steps = 50;
  c.log_every = 7;
  c.evaluate = false;
  c.deterministic = true;
  c.atom = 8;
  c.timeout = std::chrono::seconds(60);
  return c;
}

// The same global batch of 64 cut 1, 2, 4 and 8 ways, over 50 steps (3 epochs
// of 1024 samples, shuffled): one answer, bit for bit.
void expect_invariant(TrainConfig c, const data::ImageClassificationData& data) {
  std::vector<Final> finals;
  for (int n : {1, 2, 4, 8}) {
    c.replicas = n;
    c.micro_batch = 64 / n;
    finals.push_back(run(c, data));
    ASSERT_FALSE(finals.back().params.empty());
    const auto& f = finals.back();
    EXPECT_TRUE(f == finals[0]) << c.model << " " << c.optimizer << ": N=" << n << " differs from N=1 in"
                                << (f.params != finals[0].params ? " weights" : "")
                                << (f.state != finals[0].state ? " optimizer-state" : "")
                                << (f.buffers != finals[0].buffers ? " buffers" : "")
                                << (f.loss != finals[0].loss ? " loss" : "");
    for (std::size_t i = 0; i < f.buffers.size() && i < finals[0].buffers.size(); ++i)
      if (f.buffers[i] != finals[0].buffers[i]) {
        ADD_FAILURE() << "buffer " << i << " of " << f.buffers.size() << ": " << f.buffers[i] << " vs " << finals[0].buffers[i];
        break;
      }
  }
  c.replicas = 4;
  c.micro_batch = 16;
  EXPECT_TRUE(run(c, data) == finals[2]) << "a repeated run differs";
  // The fast path is not invariant (so the comparison above can fail).
  c.deterministic = false;
  c.replicas = 1;
  c.micro_batch = 64;
  const auto one = run(c, data);
  c.replicas = 8;
  c.micro_batch = 8;
  EXPECT_FALSE(run(c, data) == one) << "without --deterministic N=1 and N=8 agree: the test cannot tell";
}

TEST(Deterministic, MlpWithSgdIsBitExactForAnyReplicaCount) {
  expect_invariant(config("mlp", "sgd"), synthetic_data(1024));
}

TEST(Deterministic, MlpWithAdamWIsBitExactForAnyReplicaCount) {
  expect_invariant(config("mlp", "adamw"), synthetic_data(1024));
}

// Batch norm (buffers), dropout (keyed masks), convolutions.
TEST(Deterministic, CnnWithBatchNormAndDropoutIsBitExactForAnyReplicaCount) {
  auto c = config("cnn", "sgd");
  c.steps = 12;
  expect_invariant(c, synthetic_data(512, 28 * 28));
}

// A model of the user's own (TrainConfig::model_factory), which neither
// built-in one is: two hidden widths, batch norm (buffers) and dropout.
TEST(Deterministic, AUserModelIsBitExactForAnyReplicaCount) {
  auto c = config("bn-mlp", "sgd");
  c.model_factory = [](std::int64_t features, std::int64_t classes) {
    return testing::bn_mlp(features, classes);
  };
  expect_invariant(c, synthetic_data(1024));
}

TEST(Deterministic, RefusesWhatItCannotKeepExact) {
  auto c = config("mlp", "sgd");
  c.replicas = 3;
  c.micro_batch = 16;
  try {
    train(c, synthetic_data(1024));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("power-of-two number of replicas"), std::string::npos) << e.what();
  }
  c.replicas = 2;
  c.micro_batch = 24;  // 3 atoms of 8
  try {
    train(c, synthetic_data(1024));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("power-of-two number of atoms"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::train
