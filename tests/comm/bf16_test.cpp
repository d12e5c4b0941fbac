#include "lockstep/comm/bf16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "run_ranks.h"

namespace lockstep::comm {
namespace {

using testing::rethrow_first;
using testing::run_ranks;

bool is_nan_bf16(std::uint16_t h) {
  return (h & 0x7fffu) > 0x7f80u;
}

// The naive sibling of to_bf16 for finite floats: the two bf16 neighbours of
// x, compared by distance in double, ties to the even bit pattern.
std::uint16_t reference_to_bf16(float x) {
  const auto toward_zero = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16);
  const auto away = static_cast<std::uint16_t>(toward_zero + 1);  // next magnitude up
  const double low = from_bf16(toward_zero);
  // Past the largest finite bf16 the next step would be 2^128: IEEE rounds to
  // inf from the midpoint on.
  const double high = std::isinf(from_bf16(away)) ? std::copysign(0x1p128, x) : double(from_bf16(away));
  const double d_low = std::abs(double(x) - low), d_high = std::abs(high - double(x));
  if (d_low != d_high) return d_low < d_high ? toward_zero : away;
  return (toward_zero & 1u) == 0 ? toward_zero : away;
}

TEST(Bf16Convert, EveryBf16RoundTripsExactly) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    if (is_nan_bf16(b)) continue;
    ASSERT_EQ(to_bf16(from_bf16(b)), b) << std::hex << h;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(from_bf16(b)), h << 16) << std::hex << h;
  }
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(to_bf16(-2.5f), 0xc020);
  EXPECT_EQ(to_bf16(0.0f), 0x0000);
  EXPECT_EQ(to_bf16(-0.0f), 0x8000);
}

TEST(Bf16Convert, TiesRoundToEven) {
  // Hand-picked: 1 + 2^-8 lies halfway between 1 (0x3f80, even) and 1 + 2^-7.
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);         // halfway 0x3f81 (odd) .. 0x3f82
  EXPECT_EQ(to_bf16(-(1.0f + 0x1p-8f)), 0xbf80);          // sign does not matter
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // just above the tie
  EXPECT_EQ(to_bf16(2.0f - 0x1p-9f), 0x4000);             // carries into the exponent
  // Every tie: the midpoint between bf16 h and h+1 is h's bits followed by 0x8000.
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    if (is_nan_bf16(b) || (h & 0x7fffu) >= 0x7f80u) continue;  // NaN, inf
    const std::uint16_t up = static_cast<std::uint16_t>(h + 1);
    const float tie = std::bit_cast<float>((h << 16) | 0x8000u);
    const float below = std::bit_cast<float>((h << 16) | 0x7fffu);
    const float above = std::bit_cast<float>((h << 16) | 0x8001u);
    ASSERT_EQ(to_bf16(tie), (h & 1u) == 0 ? b : up) << std::hex << h;
    ASSERT_EQ(to_bf16(below), b) << std::hex << h;
    ASSERT_EQ(to_bf16(above), up) << std::hex << h;
  }
}

TEST(Bf16Convert, MatchesTheNaiveReferenceOnRandomFloats) {
  std::mt19937 rng(7);
  for (int i = 0; i < 1'000'000; ++i) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    if (!std::isfinite(x)) continue;
    ASSERT_EQ(to_bf16(x), reference_to_bf16(x)) << std::hexfloat << x;
  }
}

TEST(Bf16Convert, NanStaysQuietNanAndInfStaysInf) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(to_bf16(inf), 0x7f80);
  EXPECT_EQ(to_bf16(-inf), 0xff80);
  EXPECT_TRUE(std::isinf(from_bf16(0x7f80)));
  EXPECT_TRUE(std::isinf(from_bf16(0xff80)));
  // Finite values past the largest bf16 (0x7f7f) round to inf.
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::max()), 0xff80);
  // NaNs whose payload lies only in the dropped bits (truncation would give
  // inf), all-ones NaNs (rounding would carry out), quiet and signalling.
  for (std::uint32_t bits :
       {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0xffffffffu, 0xff800001u, 0x7fa00000u}) {
    const std::uint16_t h = to_bf16(std::bit_cast<float>(bits));
    EXPECT_TRUE(is_nan_bf16(h)) << std::hex << bits << " -> " << h;
    EXPECT_TRUE(h & 0x0040u) << "not quiet: " << std::hex << bits << " -> " << h;
    EXPECT_EQ(h & 0x8000u, (bits >> 16) & 0x8000u) << "sign lost: " << std::hex << bits;
    EXPECT_TRUE(std::isnan(from_bf16(h)));
  }
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::quiet_NaN()), 0x7fc0);
}

TEST(Bf16Convert, SpansMatchScalarsAndCheckSizes) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  std::vector<float> x(1003);
  for (float& v : x) v = dist(rng);
  std::vector<std::uint16_t> h(x.size());
  to_bf16(x, h);
  std::vector<float> back(x.size());
  from_bf16(h, back);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], to_bf16(x[i])) << i;
    ASSERT_EQ(back[i], from_bf16(h[i])) << i;
  }
  std::vector<std::uint16_t> short_out(5);
  EXPECT_THROW(to_bf16(x, short_out), InvalidArgument);
  EXPECT_THROW(from_bf16(short_out, std::span<float>(back)), InvalidArgument);
}

// Rank r's input: random bf16 values in [-1, 1] (mixed signs, so partial sums
// cancel), different per rank and per case.
std::vector<std::uint16_t> bf16_input(int n, std::size_t count, int rank) {
  std::mt19937 rng(static_cast<std::uint32_t>(1000003 * n + 7919 * count + rank));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::uint16_t> x(count);
  for (auto& h : x) h = to_bf16(dist(rng));
  return x;
}

// The naive sibling of the bf16 ring, written out serially: chunk c starts as
// rank c's values and visits ranks c+1, ..., c+N-1; each visit adds in float
// and rounds to bf16; Mean scales by 1/N in float before the last rounding.
std::vector<std::uint16_t> ring_order_reference(const std::vector<std::vector<std::uint16_t>>& x,
                                                ReduceOp op) {
  const int n = static_cast<int>(x.size());
  const std::size_t count = x[0].size();
  std::vector<std::uint16_t> out(count);
  for (int c = 0; c < n; ++c) {
    for (std::size_t i = count * c / n; i < count * (c + 1) / n; ++i) {
      std::uint16_t p = x[c][i];
      for (int k = 1; k < n; ++k) {
        float f = from_bf16(p) + from_bf16(x[(c + k) % n][i]);
        if (k == n - 1 && op == ReduceOp::Mean) f *= 1.0f / static_cast<float>(n);
        p = to_bf16(f);
      }
      out[i] = p;
    }
  }
  return out;
}

// Note [bf16 all-reduce error bound] (src/comm/ring_allreduce_bf16.cpp):
// N-1 roundings to bf16 (unit roundoff 2^-8) along the ring give
// |got - exact| <= gamma_{N-1} sum_i |x_i| <= N 2^-8 sum_i |x_i| for N <= 16
// (divided by N for Mean), plus 2^-134 per rounding in the subnormal range.
TEST(Bf16Allreduce, GridIsBitwiseIdenticalOnAllRanksAndWithinTheBound) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
    for (int n : {1, 2, 3, 4, 7, 8}) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t(n - 1), std::size_t(n + 1),
                                std::size_t{1000}, std::size_t{100003}}) {
        const std::string where =
            std::string(to_string(op)) + " n=" + std::to_string(n) + " count=" + std::to_string(count);
        std::vector<std::vector<std::uint16_t>> inputs(n), results(n);
        for (int r = 0; r < n; ++r) inputs[r] = bf16_input(n, count, r);
        rethrow_first(run_ranks(n, [&](Communicator& comm) {
          std::vector<std::uint16_t> data = inputs[comm.rank()];
          allreduce_bf16(comm, data, op);
          results[comm.rank()] = std::move(data);
        }));
        for (int r = 1; r < n; ++r) {
          ASSERT_EQ(results[r], results[0]) << "rank " << r << " differs from rank 0, " << where;
        }
        ASSERT_EQ(results[0], ring_order_reference(inputs, op)) << where;

        const double scale = op == ReduceOp::Mean ? 1.0 / n : 1.0;
        const double tiny = n * std::ldexp(1.0, -134);
        double max_error = 0;
        std::size_t rounded_more_than_once = 0;  // differs from the once-rounded exact result
        for (std::size_t i = 0; i < count; ++i) {
          double exact = 0, sum_abs = 0;
          for (int r = 0; r < n; ++r) {
            exact += from_bf16(inputs[r][i]);
            sum_abs += std::abs(double(from_bf16(inputs[r][i])));
          }
          exact *= scale;
          const double got = from_bf16(results[0][i]);
          const double error = std::abs(got - exact);
          ASSERT_LE(error, n * std::ldexp(1.0, -8) * sum_abs * scale + tiny)
              << where << " i=" << i << " got " << got << " exact " << exact;
          max_error = std::max(max_error, error);
          if (results[0][i] != to_bf16(static_cast<float>(exact))) ++rounded_more_than_once;
        }
        if (n == 1) {
          EXPECT_EQ(results[0], inputs[0]) << where;  // identity
        } else if (count >= 1000) {
          // Not trivially exact: the result is bf16, so it is off somewhere ...
          EXPECT_GT(max_error, 0.0) << where;
          // ... and with N-2 intermediate roundings (N >= 3) it must differ
          // often from the sum rounded once, which is what a float path
          // rounded to bf16 at the end would give.
          if (n >= 3) {
            EXPECT_GT(rounded_more_than_once, count / 20) << where;
          }
        }
      }
    }
  }
}

TEST(Bf16Allreduce, RejectsMaxAndMinOnEveryRank) {
  for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
    for (int n : {1, 2, 4}) {
      auto errors = run_ranks(
          n,
          [&](Communicator& comm) {
            std::vector<std::uint16_t> data(10, to_bf16(1.0f));
            allreduce_bf16(comm, data, op);
          },
          std::chrono::seconds(2));
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(errors[r]) << to_string(op) << " n=" << n << " rank " << r << " did not fail";
        try {
          std::rethrow_exception(errors[r]);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(to_string(op)), std::string::npos) << e.what();
        } catch (const std::exception& e) {
          ADD_FAILURE() << to_string(op) << " n=" << n << " rank " << r
                        << ": not InvalidArgument: " << e.what();
        }
      }
    }
  }
}

// (The threads backend checks fingerprints in shared memory: no bytes.)
TEST(Bf16Allreduce, SendsHalfTheFloatRingsBytes) {
  for (int n : {2, 3, 8}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{1001}, std::size_t{24000}}) {
      std::vector<std::uint64_t> float_sent(n), bf16_sent(n);
      rethrow_first(run_ranks(n, [&](Communicator& comm) {
        std::vector<float> f(count, 1.0f);
        const std::uint64_t before = comm.stats().bytes_sent;
        allreduce(comm, f, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring});
        const std::uint64_t between = comm.stats().bytes_sent;
        std::vector<std::uint16_t> h(count, to_bf16(1.0f));
        allreduce_bf16(comm, h, ReduceOp::Sum);
        float_sent[comm.rank()] = between - before;
        bf16_sent[comm.rank()] = comm.stats().bytes_sent - between;
      }));
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(2 * bf16_sent[r], float_sent[r]) << "n=" << n << " count=" << count << " rank " << r;
        if (count % n == 0) {
          EXPECT_EQ(bf16_sent[r], 2 * (n - 1) * count / n * 2) << "n=" << n << " count=" << count;
        }
      }
    }
  }
}

TEST(Bf16Fingerprint, NamesBfloat16AndCatchesAMixWithFloat) {
  const Fingerprint fp{4,
                       CollectiveKind::Allreduce,
                       ReduceOp::Mean,
                       DataType::BFloat16,
                       1000,
                       -1,
                       static_cast<std::uint32_t>(Algorithm::Ring)};
  EXPECT_EQ(describe(fp), "allreduce(mean, bfloat16, 1000 elements, seq 4, ring)");

  auto errors = run_ranks(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 0) {
          std::vector<std::uint16_t> h(10);
          allreduce_bf16(comm, h, ReduceOp::Sum);
        } else {
          std::vector<float> f(10);
          allreduce(comm, f, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring});
        }
      },
      std::chrono::seconds(2));
  bool named = false;
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const CommAborted& ex) {
      named = named || std::string(ex.what()).find("bfloat16") != std::string::npos;
    }
  }
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace lockstep::comm
