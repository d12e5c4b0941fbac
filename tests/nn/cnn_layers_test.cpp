// The CNN layers: Conv2d (fast path against the naive sibling, finite
// differences), MaxPool2d, BatchNorm2d (gradients, running statistics against
// PyTorch's formulas, evaluation mode), Dropout (keyed masks), Flatten, and
// make_cnn end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/nn/conv2d.h"
#include "lockstep/nn/layer.h"
#include "lockstep/nn/loss.h"
#include "lockstep/nn/model.h"
#include "lockstep/nn/philox.h"
#include "nn/finite_difference.h"
#include "nn/random_values.h"

namespace lockstep::nn {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::size_t numel(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// A layer bound to storage the test owns: parameters uniform in [-1, 1].
struct Bound {
  std::unique_ptr<Layer> layer;
  std::vector<std::vector<float>> p, g, buf;

  Bound(std::unique_ptr<Layer> l, std::uint64_t seed) : layer(std::move(l)) {
    for (const auto& d : layer->params()) {
      p.push_back(uniform(numel(d.shape), -1, 1, seed++));
      g.emplace_back(numel(d.shape), kNaN);
    }
    for (const auto& d : layer->buffers()) buf.emplace_back(numel(d.shape));
    std::vector<float*> pp, gp, bp;
    for (std::size_t k = 0; k < p.size(); ++k) {
      pp.push_back(p[k].data());
      gp.push_back(g[k].data());
    }
    for (auto& b : buf) bp.push_back(b.data());
    layer->bind(pp, gp);
    layer->bind_buffers(bp);
  }
  std::vector<float> forward(const std::vector<float>& x, std::int64_t batch,
                             const ForwardContext& ctx = {}) {
    std::vector<float> y(static_cast<std::size_t>(batch * layer->out_features()), kNaN);
    layer->forward(x.data(), y.data(), batch, ctx);
    return y;
  }
};

// Checks every parameter gradient and the input gradient of loss = sum(y . r)
// against central differences.
void check_gradients(Bound& L, std::vector<float> x, std::int64_t batch, float eps, double abs_tol,
                     double rel_tol) {
  const auto r = uniform(static_cast<std::size_t>(batch * L.layer->out_features()), -1, 1, 99);
  const auto y = L.forward(x, batch);
  std::vector<float> dx(x.size(), kNaN);
  L.layer->backward(x.data(), y.data(), r.data(), dx.data(), batch, false);
  const auto grads = L.g;
  auto loss = [&] { return dot(L.forward(x, batch), r); };
  const auto decls = L.layer->params();
  double largest = 0;
  for (std::size_t k = 0; k < L.p.size(); ++k) {
    for (std::size_t i = 0; i < L.p[k].size(); ++i) {
      const double fd = central(L.p[k], i, eps, loss);
      expect_close(grads[k][i], fd, abs_tol, rel_tol, decls[k].name.c_str(), i);
      largest = std::max(largest, std::abs(fd));
    }
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double fd = central(x, i, eps, loss);
    expect_close(dx[i], fd, abs_tol, rel_tol, "dx", i);
    largest = std::max(largest, std::abs(fd));
  }
  EXPECT_GT(largest, 0.1) << "the check is not vacuous";
}

// ---- Conv2d ---------------------------------------------------------------

void expect_all_near(const std::vector<float>& got, const std::vector<float>& want, double tol,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << "[" << i << "]";
}

TEST(Conv2d, FastPathMatchesNaiveOverAGridOfShapes) {
  const Conv2dShape shapes[] = {
      {.in_channels = 1, .out_channels = 1, .height = 1, .width = 1, .kernel = 1},
      {.in_channels = 1, .out_channels = 2, .height = 5, .width = 5, .kernel = 3, .padding = 1},
      {.in_channels = 3, .out_channels = 4, .height = 7, .width = 6, .kernel = 3, .stride = 2, .padding = 1},
      {.in_channels = 2, .out_channels = 3, .height = 8, .width = 8, .kernel = 2, .stride = 2},
      {.in_channels = 2, .out_channels = 5, .height = 6, .width = 9, .kernel = 5, .padding = 2},
      {.in_channels = 4, .out_channels = 2, .height = 4, .width = 4, .kernel = 3, .stride = 3, .padding = 2},
      {.in_channels = 1, .out_channels = 16, .height = 28, .width = 28, .kernel = 3, .padding = 1},
      {.in_channels = 16, .out_channels = 32, .height = 14, .width = 14, .kernel = 3, .padding = 1},
  };
  std::uint64_t seed = 100;
  for (const auto& s : shapes) {
    for (std::int64_t B : {0, 1, 3}) {
      SCOPED_TRACE("Ci=" + std::to_string(s.in_channels) + " Co=" + std::to_string(s.out_channels) +
                   " H=" + std::to_string(s.height) + " W=" + std::to_string(s.width) +
                   " k=" + std::to_string(s.kernel) + " s=" + std::to_string(s.stride) +
                   " p=" + std::to_string(s.padding) + " B=" + std::to_string(B));
      const auto x = uniform(B * s.in_numel(), -1, 1, seed++);
      const auto w = uniform(s.out_channels * s.patch(), -1, 1, seed++);
      const auto b = uniform(s.out_channels, -1, 1, seed++);
      const auto dy = uniform(B * s.out_numel(), -1, 1, seed++);
      std::vector<float> scratch(conv2d_scratch_size(s), kNaN);
      std::vector<float> y(B * s.out_numel(), kNaN), y_ref(B * s.out_numel(), kNaN);
      conv2d_forward(s, x.data(), w.data(), b.data(), y.data(), B, scratch);
      conv2d_forward_naive(s, x.data(), w.data(), b.data(), y_ref.data(), B);
      expect_all_near(y, y_ref, 1e-5, "y");
      for (bool accumulate : {false, true}) {
        const auto dw0 = uniform(w.size(), -1, 1, seed++), db0 = uniform(b.size(), -1, 1, seed++);
        std::vector<float> dw = dw0, db = db0, dx(x.size(), kNaN);
        std::vector<float> dw_ref = dw0, db_ref = db0, dx_ref(x.size(), kNaN);
        conv2d_backward(s, x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data(), B, accumulate,
                        scratch);
        conv2d_backward_naive(s, x.data(), w.data(), dy.data(), dw_ref.data(), db_ref.data(), dx_ref.data(),
                              B, accumulate);
        expect_all_near(dw, dw_ref, 1e-5, "dw");
        expect_all_near(db, db_ref, 1e-5, "db");
        expect_all_near(dx, dx_ref, 1e-5, "dx");
      }
    }
  }
}

TEST(Conv2d, NaiveForwardOnAHandCase) {
  // One 3x3 image, a 2x2 kernel of ones, padding 1, stride 2: windows at the
  // corners of the padded 5x5 image.
  const Conv2dShape s{.height = 3, .width = 3, .kernel = 2, .stride = 2, .padding = 1};
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w = {1, 1, 1, 1}, b = {0.5f};
  std::vector<float> y(4), y_fast(4), scratch(conv2d_scratch_size(s));
  conv2d_forward_naive(s, x.data(), w.data(), b.data(), y.data(), 1);
  conv2d_forward(s, x.data(), w.data(), b.data(), y_fast.data(), 1, scratch);
  const std::vector<float> want = {1.5f, 5.5f, 11.5f, 28.5f};  // {1}, {2,3}, {4,7}, {5,6,8,9}
  EXPECT_EQ(y, want);
  EXPECT_EQ(y_fast, want);
}

TEST(Conv2d, FiniteDifferenceGradientsWithStrideAndPadding) {
  const Conv2dShape shapes[] = {
      {.in_channels = 2, .out_channels = 3, .height = 5, .width = 6, .kernel = 3, .stride = 2, .padding = 1},
      {.in_channels = 2, .out_channels = 2, .height = 4, .width = 4, .kernel = 3, .stride = 1, .padding = 1},
      {.in_channels = 1, .out_channels = 2, .height = 5, .width = 5, .kernel = 2, .stride = 3, .padding = 0},
  };
  std::uint64_t seed = 200;
  for (const auto& s : shapes) {
    Bound L(make_conv2d(s), seed);
    check_gradients(L, uniform(2 * s.in_numel(), -1, 1, seed + 50), 2, 1e-2f, 1e-3, 1e-3);
    seed += 7;
  }
}

TEST(Conv2d, DeclaresPyTorchShapesAndRejectsBadShapes) {
  auto l =
      make_conv2d({.in_channels = 3, .out_channels = 8, .height = 10, .width = 12, .kernel = 3, .stride = 2});
  const auto p = l->params();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].name, "weight");
  EXPECT_EQ(p[0].shape, (std::vector<std::int64_t>{8, 3, 3, 3}));
  EXPECT_EQ(p[1].name, "bias");
  EXPECT_EQ(p[1].shape, (std::vector<std::int64_t>{8}));
  EXPECT_EQ(l->in_features(), 3 * 10 * 12);
  EXPECT_EQ(l->out_features(), 8 * 4 * 5);  // (10-3)/2+1, (12-3)/2+1
  EXPECT_DOUBLE_EQ(l->forward_flops(2), 2.0 * 2 * 8 * 27 * 20);
  EXPECT_DOUBLE_EQ(l->backward_flops(2, true), 4.0 * 2 * 8 * 27 * 20);
  EXPECT_DOUBLE_EQ(l->backward_flops(2, false), 2.0 * 2 * 8 * 27 * 20);
  EXPECT_THROW(make_conv2d({.height = 2, .width = 2, .kernel = 3}), InvalidArgument);
  EXPECT_THROW(make_conv2d({.in_channels = 0, .height = 4, .width = 4}), InvalidArgument);
  EXPECT_THROW(make_conv2d({.height = 4, .width = 4, .stride = 0}), InvalidArgument);
  EXPECT_THROW(make_conv2d({.height = 4, .width = 4, .padding = -1}), InvalidArgument);
}

// ---- MaxPool2d ------------------------------------------------------------

// n values that are a shuffled 0.1-spaced ladder: no ties, and a step of
// 1e-2 never changes a window's maximum.
std::vector<float> distinct(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.1f * float(i) - 0.05f * float(n);
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

TEST(MaxPool2d, ForwardOnAHandCaseAndTiesGoToTheFirstMaximum) {
  auto pool = make_max_pool2d({1, 4, 4}, 2);
  EXPECT_EQ(pool->out_features(), 4);
  const std::vector<float> x = {1,  2,  5, 5,  //
                                3,  4,  5, 5,  //
                                -1, -2, 0, 7,  //
                                -3, -4, 8, 1};
  std::vector<float> y(4), dx(16, kNaN);
  pool->forward(x.data(), y.data(), 1);
  EXPECT_EQ(y, (std::vector<float>{4, 5, -1, 8}));
  const std::vector<float> dy = {10, 20, 30, 40};
  pool->backward(x.data(), y.data(), dy.data(), dx.data(), 1, false);
  EXPECT_EQ(dx, (std::vector<float>{0, 0, 20, 0,  //
                                    0, 10, 0, 0,  //
                                    30, 0, 0, 0,  //
                                    0, 0, 40, 0}));
  // A NaN in a window wins, as in PyTorch.
  std::vector<float> xn = x;
  xn[0] = kNaN;
  pool->forward(xn.data(), y.data(), 1);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 5);
}

TEST(MaxPool2d, FiniteDifferenceGradientsIncludingOverlapAndFloor) {
  struct Case {
    ImageShape in;
    std::int64_t kernel, stride;
  };
  const Case cases[] = {{{2, 4, 6}, 2, 0}, {{2, 5, 7}, 2, 2}, {{1, 7, 7}, 3, 2}, {{3, 6, 5}, 3, 1}};
  std::uint64_t seed = 300;
  for (const auto& c : cases) {
    Bound L(make_max_pool2d(c.in, c.kernel, c.stride), seed);
    check_gradients(L, distinct(2 * c.in.numel(), seed + 1), 2, 1e-2f, 1e-4, 1e-4);
    seed += 2;
  }
  EXPECT_THROW(make_max_pool2d({1, 2, 2}, 3), InvalidArgument);
}

// ---- BatchNorm2d ----------------------------------------------------------

TEST(BatchNorm2d, DeclaresPyTorchParametersAndBuffers) {
  auto bn = make_batch_norm2d({4, 3, 3});
  const auto p = bn->params(), b = bn->buffers();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].name, "weight");
  EXPECT_EQ(p[1].name, "bias");
  EXPECT_EQ(p[0].shape, (std::vector<std::int64_t>{4}));
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].name, "running_mean");
  EXPECT_EQ(b[1].name, "running_var");
  EXPECT_EQ(b[2].name, "num_batches_tracked");
  EXPECT_EQ(b[1].shape, (std::vector<std::int64_t>{4}));
  EXPECT_TRUE(b[2].shape.empty());
}

TEST(BatchNorm2d, RunningStatisticsFollowPyTorchOnAHandCase) {
  // One channel, 1x2 images, batch 2: the four values 1, 2, 3, 6.
  Bound L(make_batch_norm2d({1, 1, 2}), 1);
  std::mt19937_64 rng(0);
  L.layer->init(rng);
  EXPECT_EQ(L.p[0][0], 1);
  EXPECT_EQ(L.p[1][0], 0);
  EXPECT_EQ(L.buf[0][0], 0);
  EXPECT_EQ(L.buf[1][0], 1);
  EXPECT_EQ(L.buf[2][0], 0);
  const std::vector<float> x = {1, 2, 3, 6};
  auto y = L.forward(x, 2);
  // mean 3, biased variance 14/4, unbiased 14/3.
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], (x[i] - 3) / std::sqrt(3.5 + 1e-5), 1e-6) << i;
  EXPECT_NEAR(L.buf[0][0], 0.1 * 3, 1e-7);
  EXPECT_NEAR(L.buf[1][0], 0.9 + 0.1 * 14.0 / 3, 1e-6);
  EXPECT_EQ(L.buf[2][0], 1);
  // A second batch, 0, 0, 0, 4: mean 1, unbiased variance 12/3 = 4.
  y = L.forward({0, 0, 0, 4}, 2);
  EXPECT_NEAR(L.buf[0][0], 0.9 * 0.3 + 0.1 * 1, 1e-6);
  EXPECT_NEAR(L.buf[1][0], 0.9 * (0.9 + 0.1 * 14.0 / 3) + 0.1 * 4, 1e-6);
  EXPECT_EQ(L.buf[2][0], 2);
  // An empty batch changes nothing; one value per channel cannot be normalised.
  L.forward({}, 0);
  EXPECT_EQ(L.buf[2][0], 2);
  auto single = make_batch_norm2d({2, 1, 1});
  std::vector<float> one(2), out(2);
  EXPECT_THROW(single->forward(one.data(), out.data(), 1), InvalidArgument);
}

TEST(BatchNorm2d, FiniteDifferenceGradientsInTraining) {
  // Weight and bias random (not 1 and 0), so that every term of dx shows.
  const ImageShape s{2, 2, 3};
  Bound L(make_batch_norm2d(s), 400);
  for (auto& b : L.buf) std::fill(b.begin(), b.end(), 1.0f);
  check_gradients(L, uniform(3 * s.numel(), -2, 2, 401), 3, 1e-2f, 2e-3, 1e-2);
}

TEST(BatchNorm2d, EvaluationUsesRunningStatisticsAndLeavesThem) {
  const ImageShape s{2, 1, 3};
  Bound L(make_batch_norm2d(s), 500);
  L.buf[0] = {0.5f, -1.0f};  // running_mean
  L.buf[1] = {4.0f, 0.25f};  // running_var
  L.buf[2] = {7};
  const auto buffers = L.buf;
  L.layer->set_training(false);
  const auto x = uniform(2 * s.numel(), -2, 2, 501);
  const auto y = L.forward(x, 2);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t c = 0; c < 2; ++c)
      for (std::int64_t i = 0; i < 3; ++i) {
        const std::size_t k = (b * 2 + c) * 3 + i;
        const double want = (x[k] - L.buf[0][c]) / std::sqrt(L.buf[1][c] + 1e-5) * L.p[0][c] + L.p[1][c];
        EXPECT_NEAR(y[k], want, 1e-6) << k;
      }
  EXPECT_EQ(L.buf, buffers);
  // In evaluation the layer is affine: the finite differences are exact.
  check_gradients(L, x, 2, 1e-2f, 1e-4, 1e-4);
  EXPECT_EQ(L.buf, buffers);
}

// ---- Dropout --------------------------------------------------------------

TEST(Philox, MatchesRandom123KnownAnswers) {
  using C = std::array<std::uint32_t, 4>;
  using K = std::array<std::uint32_t, 2>;
  EXPECT_EQ(philox4x32_10(C{0, 0, 0, 0}, K{0, 0}), (C{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10(C{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, K{0xffffffff, 0xffffffff}),
            (C{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10(C{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, K{0xa4093822, 0x299f31d0}),
            (C{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// y of Dropout(p) on rows of ones: the mask times 1/(1-p).
std::vector<float> masks(float p, std::int64_t features, const ForwardContext& ctx, std::int64_t batch) {
  auto d = make_dropout(features, p);
  std::vector<float> x(batch * features, 1.0f), y(batch * features, kNaN);
  d->forward(x.data(), y.data(), batch, ctx);
  return y;
}

// A context the masks cannot be keyed by is the caller's error
// (InvalidArgument, naming the field), not an internal check's.
TEST(Dropout, AContextItCannotKeyIsRefused) {
  const std::int64_t idx[] = {1, 2};
  EXPECT_THROW(masks(0.5f, 4, {.step = std::uint64_t{1} << 32}, 1), InvalidArgument);
  EXPECT_THROW(masks(0.5f, 4, {.sample_index = idx}, 3), InvalidArgument);
  EXPECT_NO_THROW(masks(0.5f, 4, {.step = (std::uint64_t{1} << 32) - 1, .sample_index = idx}, 2));
}

TEST(Dropout, ScalesKeptElementsAndBackwardUsesTheSameMask) {
  const std::int64_t B = 3, D = 37;
  const float p = 0.3f;
  auto d = make_dropout(D, p);
  const auto x = uniform(B * D, -1, 1, 600), dy = uniform(B * D, -1, 1, 601);
  const std::int64_t idx[] = {5, 900, 17};
  const ForwardContext ctx{.seed = 42, .step = 3, .sample_index = idx};
  std::vector<float> y(B * D), dx(B * D, kNaN);
  d->forward(x.data(), y.data(), B, ctx);
  d->backward(x.data(), y.data(), dy.data(), dx.data(), B, false);
  const float scale = 1.0f / (1.0f - p);
  int kept = 0;
  for (std::int64_t r = 0; r < B; ++r)
    for (std::int64_t j = 0; j < D; ++j) {
      const std::size_t i = r * D + j;
      const bool keep = dropout_keeps(p, 42, 3, idx[r], j);
      kept += keep;
      EXPECT_EQ(y[i], keep ? x[i] * scale : 0.0f) << i;
      EXPECT_EQ(dx[i], keep ? dy[i] * scale : 0.0f) << i;
    }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, B * D);
}

TEST(Dropout, MaskOfASampleIsTheSameWhateverItsBatchOrRow) {
  const std::int64_t D = 50;
  const std::int64_t a[] = {10, 20, 30}, b[] = {30, 7, 10};
  const auto ya = masks(0.5f, D, {.seed = 1, .step = 9, .sample_index = a}, 3);
  const auto yb = masks(0.5f, D, {.seed = 1, .step = 9, .sample_index = b}, 3);
  auto row = [&](const std::vector<float>& y, int r) {
    return std::vector<float>(y.begin() + r * D, y.begin() + (r + 1) * D);
  };
  EXPECT_EQ(row(ya, 2), row(yb, 0));  // sample 30
  EXPECT_EQ(row(ya, 0), row(yb, 2));  // sample 10
  EXPECT_NE(row(ya, 0), row(ya, 1));  // different samples, different masks
  // Without indices, row r is sample r.
  const std::int64_t first[] = {0, 1, 2};
  EXPECT_EQ(masks(0.5f, D, {.seed = 1, .step = 9}, 3),
            masks(0.5f, D, {.seed = 1, .step = 9, .sample_index = first}, 3));
}

TEST(Dropout, DifferentSeedsAndStepsGiveDifferentMasks) {
  const std::int64_t D = 64, idx[] = {3};
  const auto base = masks(0.5f, D, {.seed = 1, .step = 1, .sample_index = idx}, 1);
  EXPECT_EQ(base, masks(0.5f, D, {.seed = 1, .step = 1, .sample_index = idx}, 1));
  EXPECT_NE(base, masks(0.5f, D, {.seed = 2, .step = 1, .sample_index = idx}, 1));
  EXPECT_NE(base, masks(0.5f, D, {.seed = 1, .step = 2, .sample_index = idx}, 1));
  EXPECT_NE(base, masks(0.5f, D, {.seed = 1ull << 32 | 1, .step = 1, .sample_index = idx}, 1));
  const std::int64_t far[] = {3 + (std::int64_t{1} << 32)};
  EXPECT_NE(base, masks(0.5f, D, {.seed = 1, .step = 1, .sample_index = far}, 1));
}

TEST(Dropout, DropRateIsCloseToP) {
  for (float p : {0.1f, 0.25f, 0.5f, 0.9f}) {
    const std::int64_t B = 400, D = 500;  // 200,000 draws: standard error <= 0.0012
    const auto y = masks(p, D, {.seed = 7, .step = 11}, B);
    const double dropped = double(std::count(y.begin(), y.end(), 0.0f)) / double(y.size());
    EXPECT_NEAR(dropped, p, 0.006) << "p=" << p;
    for (float v : y) ASSERT_TRUE(v == 0.0f || v == 1.0f / (1.0f - p));
  }
  // p = 0 keeps everything unscaled; p = 1 drops everything.
  for (float v : masks(0.0f, 10, {}, 2)) EXPECT_EQ(v, 1.0f);
  for (float v : masks(1.0f, 10, {}, 2)) EXPECT_EQ(v, 0.0f);
  EXPECT_THROW(make_dropout(4, 1.5f), InvalidArgument);
  EXPECT_THROW(make_dropout(4, -0.1f), InvalidArgument);
}

TEST(Dropout, EvaluationIsTheIdentity) {
  const std::int64_t B = 2, D = 9;
  auto d = make_dropout(D, 0.5f);
  d->set_training(false);
  const auto x = uniform(B * D, -1, 1, 700), dy = uniform(B * D, -1, 1, 701);
  std::vector<float> y(B * D), dx(B * D);
  d->forward(x.data(), y.data(), B, {.seed = 3, .step = 4});
  d->backward(x.data(), y.data(), dy.data(), dx.data(), B, false);
  EXPECT_EQ(y, x);
  EXPECT_EQ(dx, dy);
}

// ---- make_cnn -------------------------------------------------------------

TEST(Cnn, NamesShapesAndCountsFollowThePyTorchSequential) {
  auto m = make_cnn();
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> params = {
      {"0.weight", {16, 1, 3, 3}},  {"0.bias", {16}},  {"1.weight", {16}},       {"1.bias", {16}},
      {"4.weight", {32, 16, 3, 3}}, {"4.bias", {32}},  {"5.weight", {32}},       {"5.bias", {32}},
      {"9.weight", {128, 1568}},    {"9.bias", {128}}, {"12.weight", {10, 128}}, {"12.bias", {10}}};
  const auto& t = m->layout().tensors();
  ASSERT_EQ(t.size(), params.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].name, params[i].first);
    EXPECT_EQ(t[i].shape, params[i].second) << t[i].name;
  }
  EXPECT_EQ(m->params().size(), 207018u);
  const std::vector<std::string> buffers = {"1.running_mean", "1.running_var", "1.num_batches_tracked",
                                            "5.running_mean", "5.running_var", "5.num_batches_tracked"};
  const auto& bt = m->buffer_layout().tensors();
  ASSERT_EQ(bt.size(), buffers.size());
  for (std::size_t i = 0; i < bt.size(); ++i) EXPECT_EQ(bt[i].name, buffers[i]);
  EXPECT_EQ(m->buffers().size(), 98u);
  EXPECT_EQ(m->in_features(), 784);
  EXPECT_EQ(m->out_features(), 10);
  EXPECT_EQ(m->layer_count(), 13u);
  const double conv = 2.0 * 16 * 9 * 784 + 2.0 * 32 * 144 * 196, fc = 2.0 * 1568 * 128 + 2.0 * 128 * 10;
  EXPECT_GT(m->forward_flops_per_sample(), conv + fc);
  EXPECT_LT(m->forward_flops_per_sample(), 1.05 * (conv + fc));
  EXPECT_THROW(make_cnn(1, 30, 28, 10), InvalidArgument);
  // An MLP has no buffers.
  const std::int64_t hidden[] = {4};
  EXPECT_EQ(make_mlp(3, hidden, 2)->buffers().size(), 0u);
}

TEST(Cnn, ForwardBackwardShapesAndModes) {
  auto m = make_cnn(1, 8, 8, 3);
  m->init(5);
  const std::int64_t B = 4;
  const auto x = uniform(B * 64, 0, 1, 800);
  const std::int64_t idx[] = {100, 101, 102, 103};
  const auto logits = m->forward(x, B, {}, {.seed = 1, .step = 0, .sample_index = idx});
  ASSERT_EQ(logits.size(), std::size_t(B * 3));
  for (float v : logits) EXPECT_TRUE(std::isfinite(v));
  const std::vector<float> dlogits = uniform(B * 3, -1, 1, 801);
  m->backward(dlogits, B);
  ASSERT_EQ(m->grads().size(), m->params().size());
  double norm = 0;
  for (float g : m->grads()) {
    ASSERT_TRUE(std::isfinite(g));
    norm += double(g) * g;
  }
  EXPECT_GT(norm, 0);
  const auto nbt = m->buffer_layout().find("1.num_batches_tracked");
  EXPECT_EQ(m->buffers()[nbt->offset], 1);
  // Evaluation: buffers stay, and the output no longer depends on the key.
  m->set_training(false);
  EXPECT_FALSE(m->training());
  const std::vector<float> before(m->buffers().begin(), m->buffers().end());
  const auto a = m->forward(x, B, {}, {.seed = 1});
  const std::vector<float> ya(a.begin(), a.end());
  const auto b = m->forward(x, B, {}, {.seed = 2, .step = 9});
  EXPECT_EQ(ya, std::vector<float>(b.begin(), b.end()));
  EXPECT_EQ(before, std::vector<float>(m->buffers().begin(), m->buffers().end()));
  EXPECT_THROW(m->forward(x, B, {}, {.sample_index = std::span<const std::int64_t>(idx).first(2)}), Error);
}

TEST(Cnn, AFewSgdStepsLowerTheLossOnATinyBatch) {
  auto m = make_cnn(1, 12, 12, 4);
  m->init(11);
  const std::int64_t B = 8;
  const auto x = uniform(B * 144, 0, 1, 900);
  const std::vector<std::int32_t> labels = {0, 1, 2, 3, 3, 2, 1, 0};
  std::vector<std::int64_t> idx(B);
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<float> dlogits(B * 4);
  auto step = [&](std::uint64_t s, bool update) {
    const auto logits = m->forward(x, B, {}, {.seed = 3, .step = s, .sample_index = idx});
    const double loss =
        softmax_cross_entropy(logits.data(), labels.data(), B, 4, dlogits.data(), 1.0f / B).loss_sum / B;
    if (update) {
      m->backward(dlogits, B);
      auto p = m->params();
      auto g = m->grads();
      for (std::size_t i = 0; i < p.size(); ++i) p[i] -= 0.05f * g[i];
    }
    return loss;
  };
  const double first = step(0, false);
  for (std::uint64_t s = 1; s <= 30; ++s) step(s, true);
  const double last = step(0, false);
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

TEST(Cnn, ModelFiniteDifferenceGradientsThroughConvBatchNormAndKeyedDropout) {
  // No ReLU or max-pool (their kinks are checked alone above): every
  // parameter's gradient through the Model's chain, with BatchNorm in
  // training mode and a Dropout mask that the same key draws again.
  const std::int64_t B = 3, classes = 3;
  std::vector<std::unique_ptr<Layer>> layers;
  const Conv2dShape conv{
      .in_channels = 2, .out_channels = 3, .height = 5, .width = 5, .kernel = 3, .stride = 2, .padding = 1};
  layers.push_back(make_conv2d(conv));
  layers.push_back(make_batch_norm2d({3, 3, 3}));
  layers.push_back(make_dropout(27, 0.3f));
  layers.push_back(make_flatten(27));
  layers.push_back(make_linear(27, classes));
  Model m(std::move(layers));
  m.init(21);
  auto params = m.params();
  const auto extra = uniform(params.size(), -0.5f, 0.5f, 22);  // BatchNorm away from (1, 0)
  for (std::size_t i = 0; i < params.size(); ++i) params[i] += extra[i];
  const auto x = uniform(B * conv.in_numel(), -1, 1, 23);
  const std::vector<std::int32_t> labels = {2, 0, 1};
  const std::int64_t idx[] = {40, 41, 7};
  const ForwardContext ctx{.seed = 5, .step = 2, .sample_index = idx};
  auto mean_loss = [&] {
    auto logits = m.forward(x, B, {}, ctx);
    return softmax_cross_entropy(logits.data(), labels.data(), B, classes, nullptr, 0).loss_sum / B;
  };
  auto logits = m.forward(x, B, {}, ctx);
  std::vector<float> dlogits(logits.size());
  softmax_cross_entropy(logits.data(), labels.data(), B, classes, dlogits.data(), 1.0f / B);
  m.backward(dlogits, B);
  const std::vector<float> grads(m.grads().begin(), m.grads().end());
  std::vector<float> p(params.begin(), params.end());
  double largest = 0;
  for (const auto& t : m.layout().tensors()) {
    for (std::size_t k = 0; k < t.numel; ++k) {
      const std::size_t i = t.offset + k;
      const double fd = central(p, i, 1e-2f, [&] {
        params[i] = p[i];
        return mean_loss();
      });
      params[i] = p[i];
      EXPECT_NEAR(grads[i], fd, 2e-4 + 2e-2 * std::abs(fd)) << t.name << "[" << k << "]";
      largest = std::max(largest, std::abs(fd));
    }
  }
  EXPECT_GT(largest, 1e-2);
}

TEST(Flatten, IsTheIdentityOnFlatRows) {
  auto f = make_flatten(6);
  const auto x = uniform(12, -1, 1, 1000), dy = uniform(12, -1, 1, 1001);
  std::vector<float> y(12), dx(12);
  f->forward(x.data(), y.data(), 2);
  f->backward(x.data(), y.data(), dy.data(), dx.data(), 2, false);
  EXPECT_EQ(y, x);
  EXPECT_EQ(dx, dy);
}

}  // namespace
}  // namespace lockstep::nn
