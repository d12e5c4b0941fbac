// Finite-difference gradient checks of the layers and the loss, plus the
// loss's closed forms. Central differences, losses accumulated in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "lockstep/nn/layer.h"
#include "lockstep/nn/loss.h"
#include "nn/finite_difference.h"
#include "nn/random_values.h"

namespace lockstep::nn {
namespace {

// Values with |x| in [lo, hi] and random sign: away from ReLU's kink at 0.
std::vector<float> away_from_zero(std::size_t n, float lo, float hi, std::uint64_t seed) {
  auto v = uniform(n, lo, hi, seed);
  std::mt19937_64 rng(seed ^ 0x5555);
  for (auto& x : v)
    if (rng() & 1) x = -x;
  return v;
}

// A Linear layer bound to storage the test owns.
struct BoundLinear {
  std::int64_t in, out;
  std::unique_ptr<Layer> layer;
  std::vector<float> w, b, dw, db;
  BoundLinear(std::int64_t in_, std::int64_t out_, std::uint64_t seed)
      : in(in_),
        out(out_),
        layer(make_linear(in_, out_)),
        w(uniform(in_ * out_, -1, 1, seed)),
        b(uniform(out_, -1, 1, seed + 1)),
        dw(in_ * out_),
        db(out_) {
    float* p[] = {w.data(), b.data()};
    float* g[] = {dw.data(), db.data()};
    layer->bind(p, g);
  }
  std::vector<float> forward(const std::vector<float>& x, std::int64_t batch) {
    std::vector<float> y(batch * out);
    layer->forward(x.data(), y.data(), batch);
    return y;
  }
};

TEST(Linear, DeclaresPyTorchParameterShapes) {
  auto l = make_linear(7, 3);
  const auto p = l->params();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].name, "weight");
  EXPECT_EQ(p[0].shape, (std::vector<std::int64_t>{3, 7}));
  EXPECT_EQ(p[1].name, "bias");
  EXPECT_EQ(p[1].shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(l->describe(), "Linear(7, 3)");
}

TEST(Linear, ForwardIsXWTransposePlusB) {
  BoundLinear L(2, 3, 1);
  L.w = {1, 2, 3, 4, 5, 6};  // W: (3, 2)
  L.b = {0.5f, -1, 2};
  const std::vector<float> x = {1, -1, 2, 0.5f};  // (2, 2)
  const auto y = L.forward(x, 2);
  const std::vector<float> want = {1 - 2 + 0.5f, 3 - 4 - 1, 5 - 6 + 2, 2 + 1 + 0.5f, 6 + 2 - 1, 10 + 3 + 2};
  EXPECT_EQ(y, want);
}

TEST(Linear, FiniteDifferenceGradients) {
  const std::int64_t B = 4, in = 5, out = 3;
  BoundLinear L(in, out, 11);
  auto x = uniform(B * in, -1, 1, 12);
  const auto r = uniform(B * out, -1, 1, 13);  // loss = sum(y * r), so dy = r
  std::vector<float> dx(B * in, std::numeric_limits<float>::quiet_NaN());
  const auto y = L.forward(x, B);
  L.layer->backward(x.data(), y.data(), r.data(), dx.data(), B, false);
  auto loss = [&] { return dot(L.forward(x, B), r); };
  const float eps = 1e-2f;
  for (std::size_t i = 0; i < L.w.size(); ++i)
    expect_close(L.dw[i], central(L.w, i, eps, loss), 1e-3, 1e-3, "dW", i);
  for (std::size_t i = 0; i < L.b.size(); ++i)
    expect_close(L.db[i], central(L.b, i, eps, loss), 1e-3, 1e-3, "db", i);
  for (std::size_t i = 0; i < x.size(); ++i)
    expect_close(dx[i], central(x, i, eps, loss), 1e-3, 1e-3, "dx", i);
}

TEST(Linear, BackwardAccumulateAddsToExistingGradientsAndStillWritesDx) {
  const std::int64_t B = 3, in = 4, out = 2;
  BoundLinear L(in, out, 21);
  const auto x = uniform(B * in, -1, 1, 22);
  const auto dy = uniform(B * out, -1, 1, 23);
  const auto y = L.forward(x, B);
  std::vector<float> dx_fresh(B * in), dx_acc(B * in, std::numeric_limits<float>::quiet_NaN());
  L.layer->backward(x.data(), y.data(), dy.data(), dx_fresh.data(), B, false);
  const auto dw1 = L.dw, db1 = L.db;
  // Pre-existing gradients: known values, then add one more backward on top.
  const auto dw0 = uniform(L.dw.size(), -3, 3, 24), db0 = uniform(L.db.size(), -3, 3, 25);
  L.dw = dw0;
  L.db = db0;
  float* p[] = {L.w.data(), L.b.data()};
  float* g[] = {L.dw.data(), L.db.data()};
  L.layer->bind(p, g);
  L.layer->backward(x.data(), y.data(), dy.data(), dx_acc.data(), B, true);
  for (std::size_t i = 0; i < L.dw.size(); ++i) EXPECT_NEAR(L.dw[i], dw0[i] + dw1[i], 1e-5) << i;
  for (std::size_t i = 0; i < L.db.size(); ++i) EXPECT_NEAR(L.db[i], db0[i] + db1[i], 1e-5) << i;
  EXPECT_EQ(dx_acc, dx_fresh) << "dx is written, never accumulated";
  // And accumulate == false overwrites again.
  L.layer->backward(x.data(), y.data(), dy.data(), nullptr, B, false);
  EXPECT_EQ(L.dw, dw1);
  EXPECT_EQ(L.db, db1);
}

TEST(Relu, FiniteDifferenceInputGradient) {
  const std::int64_t B = 3, D = 6;
  auto relu = make_relu(D);
  const float eps = 1e-2f;
  auto x = away_from_zero(B * D, 4 * eps, 1.0f, 31);  // |x| > 2 eps: no kink crossed
  const auto r = uniform(B * D, -1, 1, 32);
  std::vector<float> y(B * D), dx(B * D, std::numeric_limits<float>::quiet_NaN());
  relu->forward(x.data(), y.data(), B);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], std::max(x[i], 0.0f));
  relu->backward(x.data(), y.data(), r.data(), dx.data(), B, false);
  auto loss = [&] {
    std::vector<float> yy(B * D);
    relu->forward(x.data(), yy.data(), B);
    return dot(yy, r);
  };
  int positives = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    positives += x[i] > 0;
    expect_close(dx[i], central(x, i, eps, loss), 1e-4, 1e-4, "relu dx", i);
  }
  ASSERT_GT(positives, 2);
  ASSERT_LT(positives, B * D - 2);  // both branches exercised
}

// PyTorch's relu propagates NaN (pytorch/pytorch#7999, fixed in 0.4.1) and its
// backward, threshold_backward(dy, y, 0), passes dy wherever y is not <= 0, so a
// NaN activation reaches the loss instead of turning silently into a dead 0.
TEST(Relu, PropagatesNaNAsPyTorch) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  auto relu = make_relu(7);
  const std::vector<float> x = {kNaN, -1.0f, 0.0f, -0.0f, 2.0f, kInf, -kInf};
  const std::vector<float> dy = {1, 2, 3, 4, 5, 6, 7};
  std::vector<float> y(x.size()), dx(x.size(), kNaN);
  relu->forward(x.data(), y.data(), 1);
  EXPECT_TRUE(std::isnan(y[0])) << "relu(NaN) is NaN, got " << y[0];
  for (std::size_t i = 1; i < x.size(); ++i) EXPECT_EQ(y[i], std::max(x[i], 0.0f)) << i;
  relu->backward(x.data(), y.data(), dy.data(), dx.data(), 1, false);
  EXPECT_EQ(dx, (std::vector<float>{1, 0, 0, 0, 5, 6, 0}));
}

TEST(SoftmaxCrossEntropy, FiniteDifferenceOfMeanLoss) {
  const std::int64_t B = 5, C = 4;
  auto z = uniform(B * C, -2, 2, 41);
  const std::vector<std::int32_t> labels = {0, 3, 1, 2, 3};
  std::vector<float> dz(B * C, std::numeric_limits<float>::quiet_NaN());
  const float scale = 1.0f / B;
  softmax_cross_entropy(z.data(), labels.data(), B, C, dz.data(), scale);
  auto loss = [&] { return softmax_cross_entropy(z.data(), labels.data(), B, C, nullptr, 0).loss_sum / B; };
  for (std::size_t i = 0; i < z.size(); ++i)
    expect_close(dz[i], central(z, i, 1e-2f, loss), 2e-4, 2e-3, "dlogits", i);
  // Each row of softmax - onehot sums to zero.
  for (std::int64_t r = 0; r < B; ++r) {
    double s = 0;
    for (std::int64_t j = 0; j < C; ++j) s += dz[r * C + j];
    EXPECT_NEAR(s, 0.0, 1e-6) << "row " << r;
  }
}

TEST(SoftmaxCrossEntropy, ClosedFormOnSmallExample) {
  // logits (1, 2, 3), label 2: loss = log(e + e^2 + e^3) - 3.
  const float z[] = {1, 2, 3};
  const std::int32_t label[] = {2};
  float dz[3];
  const auto out = softmax_cross_entropy(z, label, 1, 3, dz, 2.0f);
  const double se = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(out.loss_sum, std::log(se) - 3.0, 1e-6);
  EXPECT_NEAR(dz[0], 2 * std::exp(1.0) / se, 1e-6);
  EXPECT_NEAR(dz[1], 2 * std::exp(2.0) / se, 1e-6);
  EXPECT_NEAR(dz[2], 2 * (std::exp(3.0) / se - 1), 1e-6);
  EXPECT_EQ(out.correct, 1);
}

TEST(SoftmaxCrossEntropy, UniformLogitsGiveLogC) {
  for (std::int64_t C : {2, 3, 10, 1000}) {
    const std::int64_t B = 3;
    std::vector<float> z(B * C, 0.75f);
    std::vector<std::int32_t> labels = {0, static_cast<std::int32_t>(C - 1), 1};
    std::vector<float> dz(B * C);
    const auto out = softmax_cross_entropy(z.data(), labels.data(), B, C, dz.data(), 1.0f);
    EXPECT_NEAR(out.loss_sum, B * std::log(double(C)), 1e-9 * B * C) << "C=" << C;
    for (std::int64_t r = 0; r < B; ++r)
      for (std::int64_t j = 0; j < C; ++j)
        EXPECT_NEAR(dz[r * C + j], 1.0 / C - (j == labels[r] ? 1.0 : 0.0), 1e-6);
  }
}

TEST(SoftmaxCrossEntropy, StableForHugeLogits) {
  const float z[] = {1000, 0, -1000, 999};
  const std::int32_t label[] = {3};
  float dz[4];
  const auto out = softmax_cross_entropy(z, label, 1, 4, dz, 1.0f);
  EXPECT_NEAR(out.loss_sum, std::log(1 + std::exp(-1.0)) + 1.0, 1e-6);
  for (float d : dz) EXPECT_TRUE(std::isfinite(d));
}

TEST(SoftmaxCrossEntropy, CountsCorrectArgMax) {
  // Row arg-maxes: 2, 0, 1, 2.
  const float z[] = {0, 1, 5, 9, -1, 2, 0, 3, 1, -4, -3, -2};
  const std::int32_t hits[] = {2, 0, 1, 2}, misses[] = {0, 1, 2, 1}, mixed[] = {2, 1, 1, 0};
  EXPECT_EQ(softmax_cross_entropy(z, hits, 4, 3, nullptr, 1).correct, 4);
  EXPECT_EQ(softmax_cross_entropy(z, misses, 4, 3, nullptr, 1).correct, 0);
  EXPECT_EQ(softmax_cross_entropy(z, mixed, 4, 3, nullptr, 1).correct, 2);
  EXPECT_EQ(softmax_cross_entropy(z, hits, 0, 3, nullptr, 1).correct, 0);
}

}  // namespace
}  // namespace lockstep::nn
