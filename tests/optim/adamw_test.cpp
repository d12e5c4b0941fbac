// AdamW against torch.optim.AdamW's documented algorithm, recomputed in double:
//   w = w * (1 - lr*wd)                       (decoupled decay, before the update)
//   m = b1*m + (1 - b1)*g;  v = b2*v + (1 - b2)*g^2
//   m_hat = m / (1 - b1^t); v_hat = v / (1 - b2^t)
//   w = w - lr * m_hat / (sqrt(v_hat) + eps)  (eps after the square root)
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::optim::adamw_test {
namespace {

constexpr std::size_t P = 5;
const std::vector<float> kInit = {1.0f, -2.0f, 0.5f, 3.0f, -0.75f};
const std::vector<std::vector<float>> kGrads = {
    {0.1f, -0.2f, 0.3f, 0.0f, 1.5f}, {-0.4f, 0.25f, 0.3f, 0.7f, -1.0f}, {0.05f, -0.6f, -0.2f, 0.1f, 0.9f}};
const std::vector<float> kLr = {0.01f, 0.005f, 0.02f};

struct Expected {
  std::vector<double> w, m, v;
};

// eps_inside: the wrong placement (eps added before the bias correction of
// v), computed only to show that the tests can tell the difference.
Expected reference(const AdamWOptions& o, const std::vector<std::vector<float>>& grads,
                   bool eps_inside = false) {
  const double b1 = o.beta1, b2 = o.beta2, eps = o.eps, wd = o.weight_decay;
  Expected e{std::vector<double>(kInit.begin(), kInit.end()), std::vector<double>(P, 0.0),
             std::vector<double>(P, 0.0)};
  for (std::size_t t = 0; t < grads.size(); ++t) {
    const double lr = kLr[t];
    const double bc1 = 1 - std::pow(b1, double(t + 1)), bc2 = 1 - std::pow(b2, double(t + 1));
    for (std::size_t i = 0; i < P; ++i) {
      const double g = grads[t][i];
      e.w[i] *= 1 - lr * wd;
      e.m[i] = b1 * e.m[i] + (1 - b1) * g;
      e.v[i] = b2 * e.v[i] + (1 - b2) * g * g;
      const double denom =
          eps_inside ? (std::sqrt(e.v[i]) + eps) / std::sqrt(bc2) : std::sqrt(e.v[i] / bc2) + eps;
      e.w[i] -= lr * (e.m[i] / bc1) / denom;
    }
  }
  return e;
}

void expect_rel(double got, double want, const char* what, std::size_t i) {
  EXPECT_NEAR(got, want, 1e-6 * std::abs(want) + 1e-9) << what << "[" << i << "]";
}

void run_and_compare(const AdamWOptions& o, const std::vector<std::vector<float>>& grads = kGrads) {
  auto opt = make_adamw(P, o);
  ASSERT_EQ(opt->slot_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  ASSERT_EQ(opt->state().size(), 2 * P);
  std::vector<float> w = kInit;
  for (std::size_t t = 0; t < grads.size(); ++t) {
    opt->step(w, grads[t], kLr[t]);
    EXPECT_EQ(opt->steps_taken(), static_cast<std::int64_t>(t + 1));
  }
  const Expected e = reference(o, grads);
  for (std::size_t i = 0; i < P; ++i) {
    expect_rel(w[i], e.w[i], "w", i);
    expect_rel(opt->state()[i], e.m[i], "exp_avg", i);
    expect_rel(opt->state()[P + i], e.v[i], "exp_avg_sq", i);
  }
}

TEST(AdamW, WithoutWeightDecay) {
  run_and_compare({.weight_decay = 0.0f});
}

TEST(AdamW, WithWeightDecay) {
  run_and_compare({.weight_decay = 0.1f});
}

TEST(AdamW, DefaultOptions) {
  run_and_compare({});
}

TEST(AdamW, OtherBetas) {
  run_and_compare({.beta1 = 0.5f, .beta2 = 0.9f, .weight_decay = 0.01f});
}

// With eps comparable to sqrt(v_hat), where eps goes matters; the reference
// with the other placement must differ, and the optimizer must match ours.
TEST(AdamW, EpsIsAddedAfterTheSquareRootOfVHat) {
  const AdamWOptions o{.eps = 1e-2f, .weight_decay = 0.0f};
  std::vector<std::vector<float>> small = kGrads;
  for (auto& g : small)
    for (auto& x : g) x *= 0.02f;
  const auto right = reference(o, small), wrong = reference(o, small, true);
  for (std::size_t i = 0; i < P; ++i) {
    if (small[0][i] == 0 && small[1][i] == 0 && small[2][i] == 0) continue;
    ASSERT_GT(std::abs(right.w[i] - wrong.w[i]), 100 * 1e-6 * std::abs(right.w[i])) << i;
  }
  run_and_compare(o, small);
}

TEST(AdamW, FirstStepMovesEachWeightByLrTimesSignOfGradient) {
  // t = 1: m_hat = g, v_hat = g^2, so the step is lr * g / (|g| + eps).
  auto opt = make_adamw(P, {.weight_decay = 0.0f});
  std::vector<float> w = kInit;
  opt->step(w, kGrads[0], 0.1f);
  for (std::size_t i = 0; i < P; ++i) {
    const double g = kGrads[0][i];
    const double want = kInit[i] - (g == 0 ? 0.0 : 0.1 * g / (std::abs(g) + 1e-8));
    expect_rel(w[i], want, "w", i);
  }
}

TEST(AdamW, DecayIsDecoupledFromTheGradient) {
  // Zero gradient: m = v = 0, so only the decay acts: w *= 1 - lr*wd per step.
  auto opt = make_adamw(P, {.weight_decay = 0.5f});
  std::vector<float> w = kInit;
  const std::vector<float> zero(P, 0.0f);
  opt->step(w, zero, 0.1f);
  opt->step(w, zero, 0.2f);
  for (std::size_t i = 0; i < P; ++i) expect_rel(w[i], kInit[i] * 0.95 * 0.9, "w", i);
}

// torch's exp_avg.lerp_(g, 1 - b1) computes m + w (g - m) for w < 0.5 but
// g - (g - m)(1 - w) from 0.5 on, so that w = 1 (b1 = 0) gives m = g exactly.
// m + (g - m) loses a small g after a large m: 1 + (1e-8 - 1) is 0 in float.
TEST(AdamW, Beta1ZeroKeepsTheGradientExactlyAsTorchLerp) {
  const std::vector<std::vector<float>> grads = {
      {1.0f, -3.0f, 1e-8f}, {1e-8f, 2e-7f, 5.0f}, {-4e-9f, 1.0f, 0.0f}};
  auto opt = make_adamw(3, {.beta1 = 0.0f, .weight_decay = 0.0f});
  std::vector<float> w = {0.5f, -0.5f, 1.0f};
  for (const auto& g : grads) {
    opt->step(w, g, 0.01f);
    for (std::size_t i = 0; i < g.size(); ++i) EXPECT_EQ(opt->state()[i], g[i]) << "exp_avg[" << i << "]";
  }
}

TEST(AdamW, InvalidOptionsThrow) {
  EXPECT_THROW(make_adamw(P, {.beta1 = 1.0f}), InvalidArgument);
  EXPECT_THROW(make_adamw(P, {.beta1 = -0.1f}), InvalidArgument);
  EXPECT_THROW(make_adamw(P, {.beta2 = 1.0f}), InvalidArgument);
  EXPECT_THROW(make_adamw(P, {.beta2 = -0.5f}), InvalidArgument);
  EXPECT_THROW(make_adamw(P, {.eps = 0.0f}), InvalidArgument);
  EXPECT_THROW(make_adamw(P, {.eps = -1e-8f}), InvalidArgument);
  EXPECT_THROW(make_adamw(P, {.weight_decay = -0.01f}), InvalidArgument);
  // NaN passes every "< 0" test: each one would make every weight NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(make_adamw(P, {.beta1 = nan}), InvalidArgument);
  EXPECT_THROW(make_adamw(P, {.beta2 = nan}), InvalidArgument);
  EXPECT_THROW(make_adamw(P, {.eps = nan}), InvalidArgument);
  EXPECT_THROW(make_adamw(P, {.weight_decay = nan}), InvalidArgument);
  EXPECT_NO_THROW(make_adamw(P, {.beta1 = 0.0f, .beta2 = 0.0f}));
}

}  // namespace
}  // namespace lockstep::optim::adamw_test
