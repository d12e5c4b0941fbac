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

}  // namespace
}  // namespace lockstep::cost
