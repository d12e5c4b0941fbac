// SGD against torch.optim.SGD's documented algorithm, recomputed in double:
//   d = g + wd*w
//   if momentum: buf = d (first step) else momentum*buf + (1 - dampening)*d
//                d = d + momentum*buf (nesterov) else buf
//   w = w - lr*d
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::optim::sgd_test {
namespace {

constexpr std::size_t P = 5;
const std::vector<float> kInit = {1.0f, -2.0f, 0.5f, 3.0f, -0.75f};
// Three steps, each with its own gradient and learning rate.
const std::vector<std::vector<float>> kGrads = {
    {0.1f, -0.2f, 0.3f, 0.0f, 1.5f}, {-0.4f, 0.25f, 0.3f, 0.7f, -1.0f}, {0.05f, -0.6f, -0.2f, 0.1f, 0.9f}};
const std::vector<float> kLr = {0.1f, 0.05f, 0.2f};

struct Expected {
  std::vector<double> w, buf;
};

Expected reference(const SgdOptions& o) {
  // The options as the optimizer sees them: float values, widened.
  const double mu = o.momentum, damp = o.dampening, wd = o.weight_decay;
  Expected e{std::vector<double>(kInit.begin(), kInit.end()), std::vector<double>(P, 0.0)};
  for (std::size_t t = 0; t < kGrads.size(); ++t) {
    for (std::size_t i = 0; i < P; ++i) {
      double d = double(kGrads[t][i]) + wd * e.w[i];
      if (mu != 0) {
        e.buf[i] = t == 0 ? d : mu * e.buf[i] + (1 - damp) * d;
        d = o.nesterov ? d + mu * e.buf[i] : e.buf[i];
      }
      e.w[i] -= double(kLr[t]) * d;
    }
  }
  return e;
}

void expect_rel(double got, double want, const char* what, std::size_t i) {
  EXPECT_NEAR(got, want, 1e-6 * std::abs(want) + 1e-7) << what << "[" << i << "]";
}

// Runs the three steps and compares weights and momentum buffer.
void run_and_compare(const SgdOptions& o) {
  auto opt = make_sgd(P, o);
  std::vector<float> w = kInit;
  for (std::size_t t = 0; t < kGrads.size(); ++t) {
    opt->step(w, kGrads[t], kLr[t]);
    EXPECT_EQ(opt->steps_taken(), static_cast<std::int64_t>(t + 1));
  }
  const Expected e = reference(o);
  for (std::size_t i = 0; i < P; ++i) expect_rel(w[i], e.w[i], "w", i);
  if (o.momentum != 0) {
    ASSERT_EQ(opt->state().size(), P);
    for (std::size_t i = 0; i < P; ++i) expect_rel(opt->state()[i], e.buf[i], "momentum_buffer", i);
  }
}

TEST(Sgd, PlainHasNoStateAndIsWMinusLrG) {
  const SgdOptions o{.momentum = 0.0f};
  auto opt = make_sgd(P, o);
  EXPECT_EQ(opt->state().size(), 0u);
  EXPECT_TRUE(opt->slot_names().empty());
  std::vector<float> w = kInit;
  opt->step(w, kGrads[0], kLr[0]);
  for (std::size_t i = 0; i < P; ++i)
    expect_rel(w[i], double(kInit[i]) - double(kLr[0]) * kGrads[0][i], "w", i);
  run_and_compare(o);
}

TEST(Sgd, PlainWithWeightDecay) {
  run_and_compare({.momentum = 0.0f, .weight_decay = 0.1f});
}

TEST(Sgd, MomentumFirstStepBufferIsTheGradient) {
  const SgdOptions o{.momentum = 0.9f, .dampening = 0.5f};
  auto opt = make_sgd(P, o);
  ASSERT_EQ(opt->slot_names(), std::vector<std::string>{"momentum_buffer"});
  std::vector<float> w = kInit;
  opt->step(w, kGrads[0], kLr[0]);
  // First step: buf = g (no dampening), w -= lr * g.
  for (std::size_t i = 0; i < P; ++i) {
    expect_rel(opt->state()[i], kGrads[0][i], "buf", i);
    expect_rel(w[i], double(kInit[i]) - double(kLr[0]) * kGrads[0][i], "w", i);
  }
}

TEST(Sgd, Momentum) {
  run_and_compare({.momentum = 0.9f});
}

TEST(Sgd, MomentumWithDampening) {
  run_and_compare({.momentum = 0.8f, .dampening = 0.3f});
}

TEST(Sgd, Nesterov) {
  run_and_compare({.momentum = 0.9f, .nesterov = true});
}

TEST(Sgd, MomentumWithWeightDecay) {
  run_and_compare({.momentum = 0.9f, .weight_decay = 0.05f});
}

TEST(Sgd, NesterovWithWeightDecay) {
  run_and_compare({.momentum = 0.7f, .weight_decay = 0.02f, .nesterov = true});
}

// The reference must itself be sensitive to the variants, or the tests above
// could not tell them apart.
TEST(Sgd, ReferenceVariantsDiffer) {
  const auto plain = reference({.momentum = 0.0f}).w, mom = reference({.momentum = 0.9f}).w,
             nes = reference({.momentum = 0.9f, .nesterov = true}).w,
             damp = reference({.momentum = 0.9f, .dampening = 0.3f}).w;
  for (std::size_t i = 0; i < P; ++i) {
    EXPECT_GT(std::abs(plain[i] - mom[i]) + std::abs(mom[i] - nes[i]) + std::abs(mom[i] - damp[i]), 1e-3);
  }
}

TEST(Sgd, ZeroGradientAndZeroLrLeaveWeightsAlone) {
  auto opt = make_sgd(P, {.momentum = 0.9f});
  std::vector<float> w = kInit;
  opt->step(w, std::vector<float>(P, 0.0f), 0.5f);
  EXPECT_EQ(w, kInit);
  opt->step(w, kGrads[1], 0.0f);
  EXPECT_EQ(w, kInit);
}

TEST(Sgd, InvalidOptionsThrow) {
  EXPECT_THROW(make_sgd(P, {.momentum = -0.1f}), InvalidArgument);
  EXPECT_THROW(make_sgd(P, {.momentum = 0.9f, .weight_decay = -1e-4f}), InvalidArgument);
  EXPECT_THROW(make_sgd(P, {.momentum = 0.0f, .nesterov = true}), InvalidArgument);
  EXPECT_THROW(make_sgd(P, {.momentum = 0.9f, .dampening = 0.1f, .nesterov = true}), InvalidArgument);
  EXPECT_NO_THROW(make_sgd(P, {.momentum = 0.9f, .nesterov = true}));
  // NaN passes every "< 0" test: each one would make every weight NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(make_sgd(P, {.momentum = nan}), InvalidArgument);
  EXPECT_THROW(make_sgd(P, {.weight_decay = nan}), InvalidArgument);
  EXPECT_THROW(make_sgd(P, {.dampening = nan}), InvalidArgument);
  EXPECT_THROW(make_sgd(P, {.dampening = -1.0f}), InvalidArgument);
}

// A state past any machine, and a step at a learning rate that is not a
// number, are refused: the first came out as a state of 0 floats.
TEST(Optimizers, ImpossibleStateAndLearningRateAreRefused) {
  EXPECT_THROW(make_adamw(std::size_t{1} << 63, {}), InvalidArgument);
  EXPECT_THROW(make_sgd(std::size_t{1} << 62, {}), InvalidArgument);
  auto sgd = make_sgd(2, {});
  std::vector<float> w = {1, 2}, g = {0.5f, 0.5f};
  EXPECT_THROW(sgd->step(w, g, std::numeric_limits<float>::quiet_NaN()), InvalidArgument);
  EXPECT_EQ(w, (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace lockstep::optim::sgd_test
