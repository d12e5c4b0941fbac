// The model beside published scaling results. Prints the table recorded in
// docs/cost-model.md and checks what the model can promise: every published
// efficiency lies between the no-overlap bound and the full-overlap prediction.
#include "lockstep/cost/published.h"

#include <gtest/gtest.h>

#include <iostream>

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

}  // namespace
}  // namespace lockstep::cost
