// step_ranges_and_zero_grads (ZeRO-1): an optimizer over some ranges of the
// parameters updates them exactly as a whole optimizer does, bit for bit,
// leaves the others alone, and zeroes every gradient.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {
namespace {

using Make = std::function<std::unique_ptr<Optimizer>(std::size_t)>;

void expect_ranges_match_whole(const Make& make) {
  const std::size_t n = 1000;
  const std::vector<ParamRange> ranges = {{0, 3}, {100, 250}, {700, 1}, {990, 10}};
  std::size_t owned = 0;
  for (const auto& r : ranges) owned += r.numel;
  std::vector<float> w_whole(n), w_sharded(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    w_whole[i] = w_sharded[i] = 0.01f * float(i % 97) - 0.3f;
    g[i] = 0.02f * float((i * 7) % 89) - 0.8f;
  }
  const std::vector<float> w_start = w_whole;
  auto whole = make(n), sharded = make(owned);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g1 = g, g2 = g;
    whole->step_and_zero_grads(w_whole, g1, 0.1f);
    sharded->step_ranges_and_zero_grads(w_sharded, g2, ranges, 0.1f);
    for (float x : g2) ASSERT_EQ(x, 0.0f);
    std::vector<bool> in_range(n);
    std::size_t at = 0;
    for (const auto& r : ranges) {
      for (std::size_t i = r.offset; i < r.offset + r.numel; ++i, ++at) {
        in_range[i] = true;
        ASSERT_EQ(std::bit_cast<std::uint32_t>(w_sharded[i]), std::bit_cast<std::uint32_t>(w_whole[i]))
            << "step " << step << " i " << i;
        for (std::size_t s = 0; s < whole->slot_names().size(); ++s)
          ASSERT_EQ(sharded->state()[s * owned + at], whole->state()[s * n + i])
              << "slot " << s << " i " << i;
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!in_range[i]) {
        ASSERT_EQ(w_sharded[i], w_start[i]) << "a weight outside the ranges moved, i " << i;
      }
    }
  }
  EXPECT_EQ(sharded->steps_taken(), 3);
}

TEST(ShardedStep, SgdWithMomentumMatchesTheWholeOptimizer) {
  expect_ranges_match_whole(
      [](std::size_t n) { return make_sgd(n, {.momentum = 0.9f, .weight_decay = 1e-4f}); });
}

TEST(ShardedStep, SgdNesterovMatchesTheWholeOptimizer) {
  expect_ranges_match_whole([](std::size_t n) { return make_sgd(n, {.momentum = 0.9f, .nesterov = true}); });
}

TEST(ShardedStep, AdamWMatchesTheWholeOptimizer) {
  expect_ranges_match_whole([](std::size_t n) { return make_adamw(n, {.weight_decay = 0.01f}); });
}

TEST(ShardedStep, BadRangesAreRefused) {
  auto opt = make_sgd(10, {});
  std::vector<float> w(100), g(100);
  const std::vector<ParamRange> overlapping = {{0, 6}, {5, 4}};
  const std::vector<ParamRange> past_the_end = {{95, 10}};
  const std::vector<ParamRange> too_few = {{0, 4}};
  EXPECT_THROW(opt->step_ranges_and_zero_grads(w, g, overlapping, 0.1f), InvalidArgument);
  EXPECT_THROW(opt->step_ranges_and_zero_grads(w, g, past_the_end, 0.1f), InvalidArgument);
  EXPECT_THROW(opt->step_ranges_and_zero_grads(w, g, too_few, 0.1f), InvalidArgument);
  std::vector<float> short_g(99);
  const std::vector<ParamRange> fine = {{0, 10}};
  EXPECT_THROW(opt->step_ranges_and_zero_grads(w, short_g, fine, 0.1f), InvalidArgument);
  EXPECT_EQ(opt->steps_taken(), 0);
}

}  // namespace
}  // namespace lockstep::optim
