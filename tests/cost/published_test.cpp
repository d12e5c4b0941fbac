// The model beside published scaling results. Prints the table recorded in
// docs/cost-model.md and checks what the model can promise: every published
// efficiency lies between the no-overlap bound and the full-overlap prediction.
#include "lockstep/cost/published.h"

#include <gtest/gtest.h>

#include <iostream>

#include "lockstep/error.h"

namespace lockstep::cost {
namespace {

TEST(Published, PredictionsBracketThePublishedEfficiencies) {
  const auto cases = published_cases();
  std::cout << published_table(cases);
  ASSERT_EQ(cases.size(), 8u);
  for (const PublishedCase& c : cases) {
    EXPECT_LE(c.predicted_no_overlap, c.published + 0.02) << c.name;
    EXPECT_GE(c.predicted, c.published - 0.02) << c.name;
    EXPECT_LE(c.predicted, 1.0) << c.name;
  }
}

// Stragglers only slow a step, and one c, fitted to the other cases, must
// predict each held-out case better in sum than the model without them; the
// fitted c must lie inside the searched grid, not at its edge.
TEST(Published, StragglersFittedToTheOthersPredictTheHeldOutCase) {
  const auto cases = published_cases();
  double without = 0, with = 0;
  for (const PublishedCase& c : cases) {
    EXPECT_LE(c.predicted_stragglers, c.predicted + 1e-12) << c.name;
    EXPECT_GT(c.straggler_cv, 0) << c.name;
    EXPECT_LT(c.straggler_cv, 0.1) << c.name;
    without += (c.predicted - c.published) * (c.predicted - c.published);
    with += (c.predicted_stragglers - c.published) * (c.predicted_stragglers - c.published);
  }
  EXPECT_LT(with, without / 2);
}

// Leaving a whole system out: a system with one case (Goyal, DDP) is fitted
// as when that case alone is left out; the six Horovod rows leave together,
// so one c serves them all, fitted to the other two systems only.
TEST(Published, LeavingTheSystemOutFitsWithoutAnyCaseOfIt) {
  const auto cases = published_cases();
  const auto horovod = [](const PublishedCase& c) { return c.name.starts_with("Horovod"); };
  double horovod_cv = -1;
  int horovod_rows = 0;
  for (const PublishedCase& c : cases) {
    if (!horovod(c)) {
      EXPECT_EQ(c.straggler_cv_system_out, c.straggler_cv) << c.name;
      EXPECT_EQ(c.predicted_stragglers_system_out, c.predicted_stragglers) << c.name;
      continue;
    }
    ++horovod_rows;
    if (horovod_cv < 0) horovod_cv = c.straggler_cv_system_out;
    EXPECT_EQ(c.straggler_cv_system_out, horovod_cv) << c.name;
    EXPECT_LE(c.predicted_stragglers_system_out, c.predicted + 1e-12) << c.name;
  }
  EXPECT_EQ(horovod_rows, 6);
  EXPECT_GT(horovod_cv, 0);
}

// The fit is honest only if the held-out case cannot move it: changing its
// published value leaves the fitted c where it was, while changing any other
// case's can move it.
TEST(Published, TheHeldOutCaseDoesNotMoveItsOwnFit) {
  // Three cases whose curves fall linearly with k at different rates, and
  // published values each case would fit at another k.
  std::vector<std::vector<double>> curves(3, std::vector<double>(50));
  for (std::size_t k = 0; k < 50; ++k) {
    curves[0][k] = 1 - 0.002 * double(k);
    curves[1][k] = 1 - 0.004 * double(k);
    curves[2][k] = 1 - 0.008 * double(k);
  }
  std::vector<double> published = {0.96, 0.92, 0.84};  // each fits k = 20
  const auto only = [](std::size_t i) {
    std::vector<bool> held(3, false);
    held[i] = true;
    return held;
  };
  for (std::size_t held = 0; held < 3; ++held) {
    EXPECT_EQ(fit_leaving_out(curves, published, only(held)), 20u) << held;
    for (double moved : {0.0, 0.5, 1.0, 2.0}) {
      auto changed = published;
      changed[held] = moved;
      EXPECT_EQ(fit_leaving_out(curves, changed, only(held)), 20u) << "held-out " << held << " at " << moved;
      changed[(held + 1) % 3] = moved;  // two held out: the third alone still fits k = 20
      std::vector<bool> two(3, true);
      two[(held + 2) % 3] = false;
      EXPECT_EQ(fit_leaving_out(curves, changed, two), 20u) << "kept " << (held + 2) % 3 << " at " << moved;
    }
  }
  auto other = published;
  other[1] = 0.80;  // case 1 alone would fit k = 50, past the grid: with case 2, the fit moves above 20
  EXPECT_GT(fit_leaving_out(curves, other, only(0)), 20u);
  EXPECT_THROW(fit_leaving_out(curves, published, {true, false}), InvalidArgument);
  EXPECT_THROW(fit_leaving_out(curves, published, {true, true, true}), InvalidArgument);  // nothing to fit
  auto ragged = curves;
  ragged[2].pop_back();
  EXPECT_THROW(fit_leaving_out(ragged, published, only(0)), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::cost
