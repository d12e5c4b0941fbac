// The sequential Model: parameter names and layout, whole-network gradients,
// and the flop count.
#include "lockstep/nn/model.h"

#include <gtest/gtest.h>

#include "nn/random_values.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/nn/loss.h"

namespace lockstep::nn {
namespace {

TEST(Model, ParameterNamesFollowPyTorchSequentialAndOffsetsAreContiguous) {
  const std::int64_t hidden[] = {512, 256};
  auto model = make_mlp(784, hidden, 10);
  const auto& t = model->layout().tensors();
  ASSERT_EQ(t.size(), 6u);
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> want = {
      {"0.weight", {512, 784}}, {"0.bias", {512}},       {"2.weight", {256, 512}},
      {"2.bias", {256}},        {"4.weight", {10, 256}}, {"4.bias", {10}}};
  std::size_t offset = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].name, want[i].first);
    EXPECT_EQ(t[i].shape, want[i].second) << t[i].name;
    std::size_t numel = 1;
    for (auto d : want[i].second) numel *= static_cast<std::size_t>(d);
    EXPECT_EQ(t[i].numel, numel) << t[i].name;
    EXPECT_EQ(t[i].offset, offset) << t[i].name;
    offset += numel;
    EXPECT_EQ(model->layout().find(want[i].first), &t[i]);
  }
  EXPECT_EQ(model->layout().numel(), offset);
  EXPECT_EQ(model->params().size(), offset);
  EXPECT_EQ(model->grads().size(), offset);
  EXPECT_EQ(model->layout().find("1.weight"), nullptr);  // ReLU has no parameters
  EXPECT_EQ(model->in_features(), 784);
  EXPECT_EQ(model->out_features(), 10);
}

TEST(Model, InitIsDeterministicAndWithinPyTorchBounds) {
  const std::int64_t hidden[] = {16};
  auto a = make_mlp(9, hidden, 4), b = make_mlp(9, hidden, 4), c = make_mlp(9, hidden, 4);
  a->init(7);
  b->init(7);
  c->init(8);
  EXPECT_TRUE(std::equal(a->params().begin(), a->params().end(), b->params().begin()));
  EXPECT_FALSE(std::equal(a->params().begin(), a->params().end(), c->params().begin()));
  for (const auto& t : a->layout().tensors()) {
    const double bound = 1.0 / std::sqrt(t.name[0] == '0' ? 9.0 : 16.0);
    for (float v : a->params().subspan(t.offset, t.numel)) ASSERT_LE(std::abs(v), bound) << t.name;
  }
}

TEST(Model, RejectsMismatchedLayers) {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(make_linear(4, 5));
  layers.push_back(make_relu(6));
  EXPECT_THROW(Model(std::move(layers)), InvalidArgument);
  const std::int64_t bad[] = {0};
  EXPECT_THROW(make_mlp(4, bad, 3), InvalidArgument);
}

// The caller's mistakes are InvalidArgument naming the sizes, not an
// internal check: a wrong input size, backward past the forward's batch,
// wrong dlogits, and labels outside the classes (which would index outside
// the logits row).
TEST(Model, CallerMistakesAreInvalidArgument) {
  const std::int64_t hidden[] = {5};
  auto m = make_mlp(4, hidden, 3);
  m->init(1);
  EXPECT_THROW(m->forward(std::vector<float>(5), 2), InvalidArgument);
  EXPECT_THROW(m->backward(std::vector<float>(6), 2, false), InvalidArgument);  // no forward yet
  m->forward(std::vector<float>(8), 2);
  EXPECT_THROW(m->backward(std::vector<float>(5), 2, false), InvalidArgument);
  // A batch other than the last forward's: backward would read rows past that input.
  const std::vector<float> eight(32), two(8);
  m->forward(eight, 8);
  m->forward(two, 2);
  EXPECT_THROW(m->backward(std::vector<float>(24), 8, false), InvalidArgument);
  EXPECT_NO_THROW(m->backward(std::vector<float>(6), 2, false));
  const float logits[4] = {0, 1, 2, 3};
  for (std::int32_t label : {2, -1}) {
    const std::int32_t labels[2] = {0, label};
    EXPECT_THROW(softmax_cross_entropy(logits, labels, 2, 2, nullptr, 1), InvalidArgument) << label;
  }
  const std::int32_t labels[2] = {0, 1};
  EXPECT_THROW(softmax_cross_entropy(logits, labels, -1, 2, nullptr, 1), InvalidArgument);
  EXPECT_THROW(make_linear(0, 3), InvalidArgument);
  EXPECT_THROW(make_relu(-1), InvalidArgument);
  std::vector<std::unique_ptr<Layer>> with_null;
  with_null.push_back(make_linear(4, 3));
  with_null.push_back(nullptr);
  EXPECT_THROW(Model{std::move(with_null)}, InvalidArgument);
}

// Sizes past any machine are refused, not wrapped around to something small
// (a 2^32 x 2^32 tensor came out as 0 elements, a 2^62-float arena as no
// memory at all).
TEST(Model, SizesPastAnyMachineAreRefused) {
  Layout layout;
  EXPECT_THROW(layout.add("w", {std::int64_t{1} << 32, std::int64_t{1} << 32}), InvalidArgument);
  layout.add("a", {std::int64_t{1} << 59});
  EXPECT_THROW(layout.add("b", {std::int64_t{1} << 59, 2}), InvalidArgument);
  EXPECT_THROW(Arena(std::size_t{1} << 62), InvalidArgument);
}

TEST(Model, TrainFlopsPerSampleClosedForm) {
  const std::int64_t hidden[] = {512, 512};
  auto model = make_mlp(784, hidden, 10);
  const double macs[] = {784.0 * 512, 512.0 * 512, 512.0 * 10};
  const double total_macs = macs[0] + macs[1] + macs[2];
  // forward 2 MACs, dW 2 MACs for every Linear, dx 2 MACs for all but the first.
  const double want = 2 * total_macs + 2 * total_macs + 2 * (macs[1] + macs[2]);
  EXPECT_DOUBLE_EQ(model->forward_flops_per_sample(), 2 * total_macs);
  EXPECT_DOUBLE_EQ(model->train_flops_per_sample(), want);
  EXPECT_DOUBLE_EQ(want, 3209216.0);  // 6 x 668672 - 2 x 401408
}

// The fixture of the whole-network check: a small MLP, a batch, labels.
struct MlpCase {
  static constexpr std::int64_t in = 6, classes = 3, B = 4;
  std::unique_ptr<Model> model;
  std::vector<float> x;
  std::vector<std::int32_t> labels = {0, 2, 1, 2};

  double mean_loss() {
    auto logits = model->forward(x, B);
    return softmax_cross_entropy(logits.data(), labels.data(), B, classes, nullptr, 0).loss_sum / B;
  }
  // Smallest |pre-activation| of the hidden layers, computed in double from
  // the parameters, so the check can stay clear of ReLU kinks.
  double hidden_margin(std::span<const std::int64_t> hidden) const {
    double margin = 1e9;
    std::vector<double> act(x.begin(), x.end());
    std::int64_t width = in;
    for (std::size_t l = 0; l < hidden.size(); ++l) {
      const auto* w = model->layout().find(std::to_string(2 * l) + ".weight");
      const auto* b = model->layout().find(std::to_string(2 * l) + ".bias");
      const auto p = model->params();
      std::vector<double> next(B * hidden[l]);
      for (std::int64_t r = 0; r < B; ++r) {
        for (std::int64_t j = 0; j < hidden[l]; ++j) {
          double z = p[b->offset + j];
          for (std::int64_t k = 0; k < width; ++k) z += p[w->offset + j * width + k] * act[r * width + k];
          margin = std::min(margin, std::abs(z));
          next[r * hidden[l] + j] = std::max(z, 0.0);
        }
      }
      act = std::move(next);
      width = hidden[l];
    }
    return margin;
  }
};

TEST(Model, MlpFiniteDifferenceGradientsOfEveryParameter) {
  const std::int64_t hidden[] = {5, 4};
  const float eps = 1e-2f;
  MlpCase c;
  c.model = make_mlp(MlpCase::in, hidden, MlpCase::classes);
  // Pick the first seed whose hidden pre-activations all sit far from 0
  // (a step of eps on any parameter moves them by far less than 0.05).
  bool found = false;
  for (std::uint64_t seed = 1; seed < 200 && !found; ++seed) {
    c.model->init(seed);
    c.x = uniform(MlpCase::B * MlpCase::in, -1, 1, seed + 1000);
    found = c.hidden_margin(hidden) > 0.05;
  }
  ASSERT_TRUE(found) << "no seed keeps the check away from ReLU kinks";

  auto logits = c.model->forward(c.x, MlpCase::B);
  std::vector<float> dlogits(logits.size());
  softmax_cross_entropy(logits.data(), c.labels.data(), MlpCase::B, MlpCase::classes, dlogits.data(),
                        1.0f / MlpCase::B);
  c.model->backward(dlogits, MlpCase::B);
  const std::vector<float> grads(c.model->grads().begin(), c.model->grads().end());

  auto params = c.model->params();
  double max_grad = 0;
  for (const auto& t : c.model->layout().tensors()) {
    for (std::size_t k = 0; k < t.numel; ++k) {
      const std::size_t i = t.offset + k;
      const float saved = params[i];
      params[i] = saved + eps;
      const double up = c.mean_loss();
      params[i] = saved - eps;
      const double down = c.mean_loss();
      params[i] = saved;
      const double fd = (up - down) / (double(saved + eps) - double(saved - eps));
      EXPECT_NEAR(grads[i], fd, 2e-4 + 2e-2 * std::abs(fd)) << t.name << "[" << k << "]";
      max_grad = std::max(max_grad, std::abs(fd));
    }
  }
  EXPECT_GT(max_grad, 1e-2);  // the check is not vacuous
}

TEST(Model, BackwardAccumulateAddsAndDefaultOverwrites) {
  const std::int64_t hidden[] = {7};
  auto model = make_mlp(5, hidden, 3);
  model->init(3);
  const auto x = uniform(2 * 5, -1, 1, 4);
  const auto dy = uniform(2 * 3, -1, 1, 5);
  model->forward(x, 2);
  model->backward(dy, 2);
  const std::vector<float> once(model->grads().begin(), model->grads().end());
  model->backward(dy, 2, /*accumulate=*/true);
  for (std::size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(model->grads()[i], 2 * once[i], 1e-6) << i;
  model->backward(dy, 2);
  for (std::size_t i = 0; i < once.size(); ++i) ASSERT_EQ(model->grads()[i], once[i]) << i;
  // Splitting a batch in two and accumulating gives the gradient of the sum.
  model->forward(std::span<const float>(x).first(5), 1);
  model->backward(std::span<const float>(dy).first(3), 1);
  model->forward(std::span<const float>(x).subspan(5), 1);
  model->backward(std::span<const float>(dy).subspan(3), 1, true);
  for (std::size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(model->grads()[i], once[i], 1e-6) << i;
}

}  // namespace
}  // namespace lockstep::nn
