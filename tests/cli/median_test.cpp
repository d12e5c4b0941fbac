// The benchmarks' median (cli/median.cpp): of an odd count the middle value,
// of an even count the mean of the two middle values, in any order.
#include <gtest/gtest.h>

#include "median.h"

namespace lockstep::cli {
namespace {

TEST(Median, OfAnEvenCountIsTheMeanOfTheTwoMiddleValues) {
  EXPECT_EQ(median({}), 0);
  EXPECT_EQ(median({7}), 7);
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({10, 20}), 15);  // --repeats 2: neither the slower nor the faster
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median({5, 5, 1, 9}), 5);
}

}  // namespace
}  // namespace lockstep::cli
