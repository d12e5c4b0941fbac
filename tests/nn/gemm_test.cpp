#include "lockstep/nn/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace lockstep::nn {

// Readable parameter values in test output (found by ADL).
static void PrintTo(Trans t, std::ostream* os) {
  *os << (t == Trans::Yes ? "Trans::Yes" : "Trans::No");
}

namespace {

std::vector<float> random_vec(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

const char* name(Trans t) {
  return t == Trans::Yes ? "T" : "N";
}

// The naive reference itself, checked by hand on a 2x3 * 3x2 product, so the
// comparisons below rest on something computed independently.
TEST(SgemmNaive, MatchesHandComputedProductForEveryTranspose) {
  // A = [[1,2,3],[4,5,6]] (2x3), B = [[7,8],[9,10],[11,12]] (3x2)
  // A.B = [[58,64],[139,154]]
  const float a[] = {1, 2, 3, 4, 5, 6};
  const float at[] = {1, 4, 2, 5, 3, 6};  // A^T stored (3x2)
  const float b[] = {7, 8, 9, 10, 11, 12};
  const float bt[] = {7, 9, 11, 8, 10, 12};  // B^T stored (2x3)
  const float want[] = {58, 64, 139, 154};
  for (Trans ta : {Trans::No, Trans::Yes}) {
    for (Trans tb : {Trans::No, Trans::Yes}) {
      float c[4] = {1, 1, 1, 1};
      const float* pa = ta == Trans::Yes ? at : a;
      const float* pb = tb == Trans::Yes ? bt : b;
      const std::int64_t lda = ta == Trans::Yes ? 2 : 3, ldb = tb == Trans::Yes ? 3 : 2;
      // alpha = 2, beta = 1: C = 2 A.B + 1
      sgemm_naive(ta, tb, 2, 2, 3, 2.0f, pa, lda, pb, ldb, 1.0f, c, 2);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(c[i], 2 * want[i] + 1) << name(ta) << name(tb) << i;
      float d[4] = {1, 1, 1, 1};
      sgemm(ta, tb, 2, 2, 3, 2.0f, pa, lda, pb, ldb, 1.0f, d, 2);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(d[i], 2 * want[i] + 1) << name(ta) << name(tb) << i;
    }
  }
}

struct Shape {
  std::int64_t m, n, k;
};

// Runs sgemm and sgemm_naive on the same inputs and compares element-wise
// with a relative tolerance scaled by the sum of absolute products.
void compare(Trans ta, Trans tb, Shape s, float alpha, float beta, std::int64_t pad, std::uint64_t seed) {
  const auto [m, n, k] = s;
  // Stored shapes: op(A) is m x k, so A is m x k (No) or k x m (Yes).
  const std::int64_t a_rows = ta == Trans::Yes ? k : m, a_cols = ta == Trans::Yes ? m : k;
  const std::int64_t b_rows = tb == Trans::Yes ? n : k, b_cols = tb == Trans::Yes ? k : n;
  const std::int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
  const auto a = random_vec(static_cast<std::size_t>(a_rows * lda), seed);
  const auto b = random_vec(static_cast<std::size_t>(b_rows * ldb), seed + 1);
  std::vector<float> c0 = random_vec(static_cast<std::size_t>(m * ldc), seed + 2);
  if (beta == 0.0f) c0.assign(c0.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> fast = c0, ref = c0;
  sgemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, fast.data(), ldc);
  sgemm_naive(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, ref.data(), ldc);
  int failures = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      // Scale: sum_p |a_ip b_pj| |alpha| + |beta c0|, computed in double.
      double scale = beta == 0.0f ? 0.0 : std::abs(double(beta) * c0[i * ldc + j]);
      for (std::int64_t p = 0; p < k; ++p) {
        const float av = ta == Trans::Yes ? a[p * lda + i] : a[i * lda + p];
        const float bv = tb == Trans::Yes ? b[j * ldb + p] : b[p * ldb + j];
        scale += std::abs(double(alpha) * av * bv);
      }
      const float f = fast[i * ldc + j], r = ref[i * ldc + j];
      ASSERT_TRUE(std::isfinite(r)) << "naive left a non-finite value at " << i << "," << j;
      if (!(std::abs(double(f) - r) <= 1e-4 * scale + 1e-6) && ++failures <= 5) {
        ADD_FAILURE() << name(ta) << name(tb) << " m=" << m << " n=" << n << " k=" << k << " beta=" << beta
                      << " at (" << i << "," << j << "): sgemm " << f << " vs naive " << r;
      }
    }
    // Padding columns of C must be untouched by both.
    for (std::int64_t j = n; j < ldc; ++j) {
      const float orig = c0[i * ldc + j];
      if (std::isnan(orig)) {
        EXPECT_TRUE(std::isnan(fast[i * ldc + j])) << "sgemm wrote into the padding";
      } else {
        EXPECT_EQ(fast[i * ldc + j], orig) << "sgemm wrote into the padding";
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

class SgemmVsNaive : public ::testing::TestWithParam<std::tuple<Trans, Trans>> {};

TEST_P(SgemmVsNaive, OddShapesBetaZeroOverwritesNaN) {
  const auto [ta, tb] = GetParam();
  std::uint64_t seed = 1;
  for (Shape s : {Shape{1, 1, 1}, Shape{3, 5, 7}, Shape{33, 17, 65}, Shape{32, 512, 784}}) {
    compare(ta, tb, s, 1.0f, 0.0f, 0, seed += 10);
  }
}

TEST_P(SgemmVsNaive, OddShapesBetaOneAccumulates) {
  const auto [ta, tb] = GetParam();
  std::uint64_t seed = 100;
  for (Shape s : {Shape{1, 1, 1}, Shape{3, 5, 7}, Shape{33, 17, 65}, Shape{32, 512, 784}}) {
    compare(ta, tb, s, 1.0f, 1.0f, 0, seed += 10);
  }
}

TEST_P(SgemmVsNaive, PaddedLeadingDimensionsAndScaledAlpha) {
  const auto [ta, tb] = GetParam();
  compare(ta, tb, Shape{3, 5, 7}, 0.5f, 0.0f, 3, 7);
  compare(ta, tb, Shape{33, 17, 65}, -1.5f, 1.0f, 5, 8);
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, SgemmVsNaive,
                         ::testing::Combine(::testing::Values(Trans::No, Trans::Yes),
                                            ::testing::Values(Trans::No, Trans::Yes)),
                         [](const auto& info) {
                           return std::string(name(std::get<0>(info.param))) + name(std::get<1>(info.param));
                         });

TEST(SgemmNaive, BetaZeroOverwritesNaN) {
  const float a[] = {1, 2}, b[] = {3, 4};
  float c[1] = {std::numeric_limits<float>::quiet_NaN()};
  sgemm_naive(Trans::No, Trans::No, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, c, 1);
  EXPECT_EQ(c[0], 11.0f);
}

}  // namespace
}  // namespace lockstep::nn
