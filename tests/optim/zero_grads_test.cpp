// step_and_zero_grads must make exactly the update step() makes, bit for bit,
// and leave every gradient at 0 — for every optimizer and option set.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {
namespace {

void expect_same_update(const std::function<std::unique_ptr<Optimizer>()>& make) {
  const std::size_t n = 1000;  // long enough for the vectorised loops and their tails
  std::vector<float> w1(n), w2(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    w1[i] = w2[i] = 0.01f * float(i % 97) - 0.3f;
    g[i] = 0.02f * float((i * 7) % 89) - 0.8f;
  }
  auto a = make(), b = make();
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g2 = g;
    a->step(w1, g, 0.1f);
    b->step_and_zero_grads(w2, g2, 0.1f);
    ASSERT_EQ(0, std::memcmp(w1.data(), w2.data(), n * sizeof(float))) << "step " << step;
    ASSERT_EQ(0, std::memcmp(a->state().data(), b->state().data(), a->state().size_bytes()));
    for (float x : g2) ASSERT_EQ(x, 0.0f);
  }
}

TEST(StepAndZeroGrads, SgdVariantsMatchStepAndZeroTheGradients) {
  expect_same_update([] { return make_sgd(1000, {.momentum = 0.0f}); });
  expect_same_update([] { return make_sgd(1000, {.momentum = 0.9f, .weight_decay = 0.01f}); });
  expect_same_update([] { return make_sgd(1000, {.momentum = 0.9f, .nesterov = true}); });
}

TEST(StepAndZeroGrads, AdamWMatchesStepAndZeroesTheGradients) {
  expect_same_update([] { return make_adamw(1000, {}); });
}

TEST(StepAndZeroGrads, WrongSizesAreRefused) {
  auto opt = make_sgd(4, {});
  std::vector<float> w(4), g(3);
  EXPECT_THROW(opt->step_and_zero_grads(w, g, 0.1f), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::optim
