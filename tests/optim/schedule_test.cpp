// Learning-rate schedules: constant, and cosine decay to 0 as
// torch.optim.lr_scheduler.CosineAnnealingLR(T_max = total, eta_min = 0):
//   lr(s) = base * (1 + cos(pi * s / total)) / 2
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {
namespace {

TEST(Schedule, CosineStartsAtBase) {
  for (float base : {0.1f, 1.0f, 3e-4f})
    EXPECT_FLOAT_EQ(learning_rate(Schedule::Cosine, base, 0, 1000), base);
}

TEST(Schedule, CosineIsHalfOfBaseHalfway) {
  EXPECT_NEAR(learning_rate(Schedule::Cosine, 0.1f, 500, 1000), 0.05f, 1e-8);
  EXPECT_NEAR(learning_rate(Schedule::Cosine, 2.0f, 7, 14), 1.0f, 1e-6);
}

TEST(Schedule, CosineApproachesZeroAtTheEnd) {
  const std::int64_t total = 1000;
  const float base = 0.1f;
  const float last = learning_rate(Schedule::Cosine, base, total - 1, total);
  // base * (1 + cos(pi * 999/1000)) / 2 = base * sin^2(pi / 2000)
  const double s = std::sin(std::numbers::pi / 2000.0);
  EXPECT_NEAR(last, base * s * s, 1e-12);
  EXPECT_GT(last, 0.0f);
  EXPECT_LT(last, base * 1e-5f);
  EXPECT_NEAR(learning_rate(Schedule::Cosine, base, total, total), 0.0f, 1e-9);
}

TEST(Schedule, CosineMatchesClosedFormAndDecreases) {
  const std::int64_t total = 37;
  const float base = 0.25f;
  float prev = base + 1;
  for (std::int64_t s = 0; s <= total; ++s) {
    const float lr = learning_rate(Schedule::Cosine, base, s, total);
    const double want = base * 0.5 * (1 + std::cos(std::numbers::pi * double(s) / double(total)));
    EXPECT_NEAR(lr, want, 1e-7) << "step " << s;
    EXPECT_LT(lr, prev) << "step " << s;
    prev = lr;
  }
}

TEST(Schedule, CosineIsSymmetricAboutTheMidpoint) {
  // lr(s) + lr(total - s) = base
  for (std::int64_t s = 0; s <= 20; ++s) {
    EXPECT_NEAR(
        learning_rate(Schedule::Cosine, 1.0f, s, 20) + learning_rate(Schedule::Cosine, 1.0f, 20 - s, 20),
        1.0f, 1e-6)
        << s;
  }
}

TEST(Schedule, ConstantStays) {
  for (std::int64_t s : {0, 1, 499, 500, 999, 1000}) {
    EXPECT_EQ(learning_rate(Schedule::Constant, 0.1f, s, 1000), 0.1f) << s;
  }
  EXPECT_EQ(learning_rate(Schedule::Constant, 0.3f, 5, 0), 0.3f);
}

// Warmup W: base x (s + 1) / W for s < W, then the schedule over the other
// steps as over a run of total - W. The values torch gives for base 0.1, W 4,
// total 12 (LinearLR(start_factor = 1/4, total_iters = 3) and
// CosineAnnealingLR(T_max = 8) in SequentialLR(milestones = [4])):
// 0.025 0.05 0.075 0.1, then 0.1 x (1 + cos(pi k / 8)) / 2 for k = 0..7.
TEST(Schedule, WarmupRampsLinearlyThenTheScheduleRunsOverTheRest) {
  const float base = 0.1f;
  const std::int64_t warmup = 4, total = 12;
  for (std::int64_t s = 0; s < warmup; ++s) {
    for (auto schedule : {Schedule::Cosine, Schedule::Constant}) {
      EXPECT_FLOAT_EQ(learning_rate(schedule, base, s, total, warmup), base * float(s + 1) / float(warmup)) << s;
    }
  }
  EXPECT_EQ(learning_rate(Schedule::Cosine, base, warmup - 1, total, warmup), base);
  for (std::int64_t s = warmup; s < total; ++s) {
    const double k = double(s - warmup);
    EXPECT_NEAR(learning_rate(Schedule::Cosine, base, s, total, warmup),
                base * 0.5 * (1 + std::cos(std::numbers::pi * k / double(total - warmup))), 1e-8)
        << s;
    EXPECT_EQ(learning_rate(Schedule::Constant, base, s, total, warmup), base) << s;
  }
  for (std::int64_t s = 0; s <= total; ++s) {  // warmup 0 is no warmup
    EXPECT_EQ(learning_rate(Schedule::Cosine, base, s, total, 0), learning_rate(Schedule::Cosine, base, s, total));
  }
}

}  // namespace
}  // namespace lockstep::optim
