// Flag values with units.
#include "lockstep/cost/units.h"

#include <gtest/gtest.h>

#include "lockstep/error.h"

namespace lockstep::cost {
namespace {

TEST(Units, Counts) {
  EXPECT_DOUBLE_EQ(parse_count("25.6M", "--params"), 25.6e6);
  EXPECT_DOUBLE_EQ(parse_count("138e6", "--params"), 138e6);
  EXPECT_DOUBLE_EQ(parse_count("4k", "--params"), 4000);
  EXPECT_DOUBLE_EQ(parse_count("6.3T", "--device-flops"), 6.3e12);
  EXPECT_DOUBLE_EQ(parse_count("7B", "--params"), 7e9);  // parameters are counted in billions
  // 1e300T is finite before its unit and not after; 1e-300 is positive and no count.
  for (const char* bad : {"", "x", "-3", "0", "5Q", "5MM", "1e300T", "1e-300"}) {
    try {
      parse_count(bad, "--params");
      FAIL() << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--params"), std::string::npos);
    }
  }
}

TEST(Units, Bytes) {
  EXPECT_DOUBLE_EQ(parse_bytes("16GB", "--device-memory"), 16e9);
  EXPECT_DOUBLE_EQ(parse_bytes("16GiB", "--device-memory"), 16.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(parse_bytes("512MiB", "--device-memory"), 512.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(parse_bytes("80G", "--device-memory"), 80e9);
  EXPECT_THROW(parse_bytes("16 gallons", "--device-memory"), InvalidArgument);
  EXPECT_THROW(parse_bytes("-1GB", "--device-memory"), InvalidArgument);
  EXPECT_THROW(parse_bytes("1e300GB", "--device-memory"), InvalidArgument);  // printed "inf GB"
  EXPECT_THROW(parse_bytes("1e-300B", "--device-memory"), InvalidArgument);
}

TEST(Units, Replicas) {
  EXPECT_EQ(parse_replicas("1,2,4,8", "--replicas"), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(parse_replicas("1-64", "--replicas"), (std::vector<int>{1, 2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(parse_replicas("3-20", "--replicas"), (std::vector<int>{3, 6, 12, 20}));
  EXPECT_EQ(parse_replicas("5", "--replicas"), (std::vector<int>{5}));
  for (const char* bad : {"", "0", "4,2", "1,,2", "8-2", "1-x", "70000", "2,2"})
    EXPECT_THROW(parse_replicas(bad, "--replicas"), InvalidArgument) << bad;
}

}  // namespace
}  // namespace lockstep::cost
