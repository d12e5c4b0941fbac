// Clipping the averaged gradient (ddp/grad_clip.h): the sum of squares in its
// one fixed order, held to its naive sibling; the factor torch applies; and
// the same norm, to the bit, whether every rank sums every part or each sums
// its own and the ranks exchange them (sharded).
#include "lockstep/ddp/grad_clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "comm/run_ranks.h"
#include "lockstep/error.h"

namespace lockstep::ddp {
namespace {

using lockstep::testing::rethrow_first;
using lockstep::testing::run_ranks;

std::vector<float> random_values(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The order the header states, written out element by element.
double eight_lanes_by_hand(const std::vector<float>& v) {
  double lane[8] = {};
  for (std::size_t i = 0; i < v.size(); ++i) lane[i % 8] += double(v[i]) * double(v[i]);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

TEST(GradClip, SumOfSquaresIsTheStatedOrderAndNearTheNaiveSum) {
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 17u, 1000u, 100003u}) {
    const auto v = random_values(n, unsigned(n) + 1, 3.0f);
    const double fast = sum_of_squares(v), naive = sum_of_squares_naive(v);
    EXPECT_TRUE(same_bits(fast, eight_lanes_by_hand(v))) << n;
    EXPECT_NEAR(fast, naive, 1e-12 * naive) << n;
  }
  EXPECT_EQ(sum_of_squares(std::vector<float>{3.0f, 4.0f}), 25.0);
  // Squares exact in double: 2^-70 squared and 2^60 squared, neither lost.
  const std::vector<float> tiny_and_huge{std::ldexp(1.0f, -70), std::ldexp(1.0f, 60)};
  EXPECT_EQ(sum_of_squares(tiny_and_huge), std::ldexp(1.0, -140) + std::ldexp(1.0, 120));
}

// Over max_norm, the gradient is multiplied by max_norm / (norm + 1e-6), as
// torch.nn.utils.clip_grad_norm_; at or under it, every bit is left alone.
TEST(GradClip, ScalesOnlyAGradientOverTheNormAsTorchDoes) {
  const auto g = random_values(1000, 7);
  const double norm = std::sqrt(sum_of_squares_naive(g));
  const std::vector<Bucket> buckets = assign_buckets(std::vector<std::size_t>{600, 400}, 1200, 4000);
  for (double max_norm : {norm / 3, norm * 2}) {
    auto grads = g;
    const GradClipper clipper(buckets, 0, 1, grads.size(), {.max_norm = float(max_norm)});
    rethrow_first(run_ranks(1, [&](comm::Communicator& comm) {
      const auto r = clipper.clip(comm, grads);
      EXPECT_NEAR(r.norm, norm, 1e-9 * norm);
      EXPECT_EQ(r.clipped, max_norm < norm);
    }));
    const float factor = max_norm < norm ? float(double(float(max_norm)) / (norm + 1e-6)) : 1.0f;
    double after = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(grads[i], max_norm < norm ? g[i] * factor : g[i]) << i;
      after += double(grads[i]) * double(grads[i]);
    }
    EXPECT_NEAR(std::sqrt(after), std::min(norm, double(float(max_norm))), 1e-5 * norm);
  }
}

// Sharded, rank r holds the mean only in its own chunks and the rest is
// garbage: the ranks exchange their parts' sums and reach the norm an
// unsharded rank computes alone from the whole mean, to the bit; each scales
// its own chunks by the same factor. Over uneven chunks (N = 3, 5).
TEST(GradClip, ShardedRanksReachTheUnshardedNormToTheBit) {
  const std::vector<std::size_t> numels = {300, 31, 1000, 7, 250};
  const auto buckets = assign_buckets(numels, 1024, 4096);
  ASSERT_GT(buckets.size(), 1u);
  std::size_t total = 0;
  for (auto n : numels) total += n;
  for (int n : {3, 5}) {
    // Each rank's chunks at their own scale, so that the order in which the
    // parts' sums are added shows in the last bits.
    auto mean = random_values(total, 11, 0.2f);
    for (int r = 0; r < n; ++r) {
      for (const auto& range : owned_ranges(buckets, r, n))
        for (std::size_t i = range.offset; i < range.offset + range.numel; ++i) mean[i] *= std::ldexp(1.3f, 9 * r);
    }
    const float max_norm = 1.0f;
    auto whole = mean;
    GradClipResult alone;
    rethrow_first(run_ranks(1, [&](comm::Communicator& comm) {
      alone = GradClipper(buckets, 0, n, total, {.max_norm = max_norm}).clip(comm, whole);  // rank 0's view of n
    }));
    ASSERT_TRUE(alone.clipped);
    std::vector<GradClipResult> results(static_cast<std::size_t>(n));
    std::vector<std::vector<float>> grads(static_cast<std::size_t>(n));
    rethrow_first(run_ranks(n, [&](comm::Communicator& comm) {
      auto& g = grads[std::size_t(comm.rank())];
      g = random_values(total, 100 + unsigned(comm.rank()), 50.0f);  // not reduced here: garbage
      for (const auto& range : owned_ranges(buckets, comm.rank(), n))
        std::copy_n(mean.begin() + std::ptrdiff_t(range.offset), range.numel, g.begin() + std::ptrdiff_t(range.offset));
      results[std::size_t(comm.rank())] =
          GradClipper(buckets, comm.rank(), n, total, {.max_norm = max_norm, .sharded = true}).clip(comm, g);
    }));
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(same_bits(results[std::size_t(r)].norm, alone.norm)) << "n=" << n << " rank " << r;
      for (const auto& range : owned_ranges(buckets, r, n)) {
        EXPECT_EQ(0, std::memcmp(grads[std::size_t(r)].data() + range.offset, whole.data() + range.offset,
                                 range.numel * sizeof(float)))
            << "n=" << n << " rank " << r;
      }
    }
  }
}

// Deterministic: one part, the whole gradient, so neither the buckets nor
// the number of ranks enter the order; every rank holds the whole mean and
// scales all of it, with no exchange. The values span a few scales, so that
// another order (the ranks' chunks, as without --deterministic) shows.
TEST(GradClip, DeterministicNormIgnoresBucketsAndRanks) {
  const std::vector<std::size_t> numels = {300, 31, 1000};
  auto g = random_values(1331, 5);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] *= std::ldexp(1.0f, int(i % 7));
  const double want = std::sqrt(sum_of_squares(g));
  bool another_order_differs = false;  // so the test would see the chunked order
  for (int n : {1, 2, 4}) {
    for (std::size_t first_bucket : {std::size_t{256}, std::size_t{1} << 20}) {
      const auto buckets = assign_buckets(numels, first_bucket, 2048);
      std::vector<std::vector<float>> grads(static_cast<std::size_t>(n), g);
      std::vector<GradClipResult> results(static_cast<std::size_t>(n));
      rethrow_first(run_ranks(n, [&](comm::Communicator& comm) {
        const std::size_t r = std::size_t(comm.rank());
        const GradClipper clipper(buckets, comm.rank(), n, g.size(),
                                  {.max_norm = 1.0f, .sharded = n > 1, .deterministic = true});
        EXPECT_FALSE(clipper.exchanges());
        results[r] = clipper.clip(comm, grads[r]);
      }));
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(same_bits(results[std::size_t(r)].norm, want)) << "n=" << n << " rank " << r;
        EXPECT_TRUE(results[std::size_t(r)].clipped);
        EXPECT_EQ(0, std::memcmp(grads[std::size_t(r)].data(), grads[0].data(), g.size() * sizeof(float)));
      }
      if (n > 1) {  // the chunked order of the replicated mode gives other bits for these values
        double chunked = 0;
        for (int r = 0; r < n; ++r)
          for (const auto& range : owned_ranges(buckets, r, n))
            chunked += sum_of_squares(std::span<const float>(g).subspan(range.offset, range.numel));
        another_order_differs = another_order_differs || !same_bits(std::sqrt(chunked), want);
      }
    }
  }
  EXPECT_TRUE(another_order_differs);
}

TEST(GradClip, RefusesWhatItCannotClip) {
  const auto buckets = assign_buckets(std::vector<std::size_t>{10, 10}, 1024, 4096);
  for (float bad : {0.0f, -1.0f, std::nanf(""), INFINITY}) {
    EXPECT_THROW(GradClipper(buckets, 0, 1, 20, {.max_norm = bad}), InvalidArgument) << bad;
  }
  EXPECT_THROW(GradClipper(buckets, 2, 2, 20, {.max_norm = 1}), InvalidArgument);
  EXPECT_THROW(GradClipper(buckets, 0, 1, 30, {.max_norm = 1}), InvalidArgument);  // the buckets hold 20
  const GradClipper clipper(buckets, 0, 1, 20, {.max_norm = 1});
  std::vector<float> wrong(19);
  rethrow_first(run_ranks(1, [&](comm::Communicator& comm) {
    EXPECT_THROW(clipper.clip(comm, wrong), InvalidArgument);
  }));
}

}  // namespace
}  // namespace lockstep::ddp
