// Conv2d, the fast path: im2col + sgemm, one image at a time.
//
// With K = Ci.k.k (one patch) and P = Ho.Wo (output positions), per image:
//   im2col    cols (K, P): cols[(ci.k + i).k + j][oh.Wo + ow] = x[ci][oh.s - pad + i][ow.s - pad + j]
//   forward   y  (Co, P) = W (Co, K) . cols (K, P) + b      2.Co.K.P flops
//   backward  dW (Co, K) += dy (Co, P) . cols^T (P, K)      2.Co.K.P flops
//             db (Co)    += sum over P of dy
//             dcols (K, P) = W^T (K, Co) . dy (Co, P)       2.Co.K.P flops, if dx is needed
//             col2im: dx[ci][ih][iw] = sum of the dcols entries that im2col read from there
// One image at a time keeps the scratch small (2.K.P floats) and makes a
// sample's output independent of the batch it comes in; dW sums the images in
// batch order.
#include "lockstep/nn/conv2d.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "lockstep/error.h"
#include "lockstep/nn/gemm.h"
#include "lockstep/nn/layer.h"

namespace lockstep::nn {
namespace {

// The output columns [lo, hi) whose kernel column j reads inside the image:
// 0 <= ow.stride - pad + j < W.
struct Columns {
  std::int64_t lo, hi;
};
Columns valid_columns(const Conv2dShape& s, std::int64_t j) {
  const std::int64_t wo = s.out_width();
  auto ceil_div = [](std::int64_t a, std::int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; };
  const std::int64_t lo = std::min(wo, ceil_div(s.padding - j, s.stride));
  const std::int64_t hi = std::min(wo, ceil_div(s.width + s.padding - j, s.stride));
  return {lo, std::max(lo, hi)};
}

// x: (Ci, H, W) -> cols: (K, P)
void im2col(const Conv2dShape& s, const float* x, float* cols) {
  const std::int64_t ho = s.out_height(), wo = s.out_width(), k = s.kernel;
  for (std::int64_t ci = 0; ci < s.in_channels; ++ci) {
    const float* plane = x + ci * s.height * s.width;
    for (std::int64_t i = 0; i < k; ++i) {
      for (std::int64_t j = 0; j < k; ++j) {
        float* row = cols + ((ci * k + i) * k + j) * ho * wo;
        for (std::int64_t oh = 0; oh < ho; ++oh) {
          const std::int64_t ih = oh * s.stride - s.padding + i;
          float* out = row + oh * wo;
          if (ih < 0 || ih >= s.height) {
            std::fill(out, out + wo, 0.0f);
            continue;
          }
          const float* in = plane + ih * s.width;
          const auto [lo, hi] = valid_columns(s, j);
          std::fill(out, out + lo, 0.0f);
          for (std::int64_t ow = lo; ow < hi; ++ow) out[ow] = in[ow * s.stride - s.padding + j];
          std::fill(out + hi, out + wo, 0.0f);
        }
      }
    }
  }
}

// cols: (K, P) -> dx: (Ci, H, W), summed over every patch that read a pixel.
void col2im(const Conv2dShape& s, const float* cols, float* dx) {
  const std::int64_t ho = s.out_height(), wo = s.out_width(), k = s.kernel;
  std::fill(dx, dx + s.in_numel(), 0.0f);
  for (std::int64_t ci = 0; ci < s.in_channels; ++ci) {
    float* plane = dx + ci * s.height * s.width;
    for (std::int64_t i = 0; i < k; ++i) {
      for (std::int64_t j = 0; j < k; ++j) {
        const float* row = cols + ((ci * k + i) * k + j) * ho * wo;
        for (std::int64_t oh = 0; oh < ho; ++oh) {
          const std::int64_t ih = oh * s.stride - s.padding + i;
          if (ih < 0 || ih >= s.height) continue;
          float* out = plane + ih * s.width;
          const float* in = row + oh * wo;
          const auto [lo, hi] = valid_columns(s, j);
          for (std::int64_t ow = lo; ow < hi; ++ow) out[ow * s.stride - s.padding + j] += in[ow];
        }
      }
    }
  }
}

class Conv2d final : public Layer {
 public:
  explicit Conv2d(const Conv2dShape& s) : s_(s), scratch_(static_cast<std::size_t>(conv2d_scratch_size(s))) {}

  std::string describe() const override {
    return "Conv2d(" + std::to_string(s_.in_channels) + ", " + std::to_string(s_.out_channels) +
           ", kernel_size=" + std::to_string(s_.kernel) + ", stride=" + std::to_string(s_.stride) +
           ", padding=" + std::to_string(s_.padding) + ")";
  }
  std::int64_t in_features() const override { return s_.in_numel(); }
  std::int64_t out_features() const override { return s_.out_numel(); }

  std::vector<ParamDecl> params() const override {
    return {{"weight", {s_.out_channels, s_.in_channels, s_.kernel, s_.kernel}}, {"bias", {s_.out_channels}}};
  }
  void bind(std::span<float* const> params, std::span<float* const> grads) override {
    w_ = params[0];
    b_ = params[1];
    dw_ = grads[0];
    db_ = grads[1];
  }
  void init(std::mt19937_64& rng) override {
    // As Linear: U(-bound, bound) from the top 24 bits of each draw, with
    // bound = 1/sqrt(fan_in), fan_in = Ci.k.k (PyTorch's default).
    const float bound = 1.0f / std::sqrt(static_cast<float>(s_.patch()));
    auto u = [&] { return (static_cast<float>(rng() >> 40) * 0x1.0p-24f * 2.0f - 1.0f) * bound; };
    for (std::int64_t i = 0; i < s_.out_channels * s_.patch(); ++i) w_[i] = u();
    for (std::int64_t i = 0; i < s_.out_channels; ++i) b_[i] = u();
  }

  void forward(const float* x, float* y, std::int64_t batch, const ForwardContext&) override {
    // x: (B, Ci, H, W) -> y: (B, Co, Ho, Wo)
    conv2d_forward(s_, x, w_, b_, y, batch, scratch_);
  }
  void backward(const float* x, const float* /*y*/, const float* dy, float* dx, std::int64_t batch,
                bool accumulate) override {
    // dy: (B, Co, Ho, Wo) -> dW: (Co, Ci, k, k), db: (Co), dx: (B, Ci, H, W)
    conv2d_backward(s_, x, w_, dy, dw_, db_, dx, batch, accumulate, scratch_);
  }

  double forward_flops(std::int64_t batch) const override { return macs(batch) * 2.0; }
  double backward_flops(std::int64_t batch, bool need_dx) const override {
    return macs(batch) * (need_dx ? 4.0 : 2.0);
  }

 private:
  double macs(std::int64_t batch) const {
    return double(batch) * s_.out_channels * s_.patch() * s_.out_height() * s_.out_width();
  }

  Conv2dShape s_;
  std::vector<float> scratch_;
  float* w_ = nullptr;
  float* b_ = nullptr;
  float* dw_ = nullptr;
  float* db_ = nullptr;
};

}  // namespace

void check_conv2d_shape(const Conv2dShape& s) {
  if (s.in_channels <= 0 || s.out_channels <= 0 || s.height <= 0 || s.width <= 0 || s.kernel <= 0 ||
      s.stride <= 0 || s.padding < 0)
    throw InvalidArgument("Conv2d needs positive channels, sizes, kernel and stride and padding >= 0");
  if (s.height + 2 * s.padding < s.kernel || s.width + 2 * s.padding < s.kernel)
    throw InvalidArgument("Conv2d kernel " + std::to_string(s.kernel) + " is larger than the padded " +
                          std::to_string(s.height) + "x" + std::to_string(s.width) + " input");
}

std::int64_t conv2d_scratch_size(const Conv2dShape& s) {
  return 2 * s.patch() * s.out_height() * s.out_width();
}

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    std::int64_t batch, std::span<float> scratch) {
  const std::int64_t K = s.patch(), P = s.out_height() * s.out_width(), co = s.out_channels;
  LOCKSTEP_CHECK(static_cast<std::int64_t>(scratch.size()) >= K * P, "conv2d scratch too small");
  float* cols = scratch.data();
  for (std::int64_t n = 0; n < batch; ++n) {
    float* yn = y + n * co * P;
    for (std::int64_t c = 0; c < co; ++c) std::fill(yn + c * P, yn + (c + 1) * P, b[c]);
    im2col(s, x + n * s.in_numel(), cols);
    sgemm(Trans::No, Trans::No, co, P, K, 1.0f, w, K, cols, P, 1.0f, yn, P);
  }
}

void conv2d_backward(const Conv2dShape& s, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx, std::int64_t batch, bool accumulate, std::span<float> scratch) {
  const std::int64_t K = s.patch(), P = s.out_height() * s.out_width(), co = s.out_channels;
  LOCKSTEP_CHECK(static_cast<std::int64_t>(scratch.size()) >= 2 * K * P, "conv2d scratch too small");
  float* cols = scratch.data();
  float* dcols = cols + K * P;
  if (!accumulate) {
    std::fill(dw, dw + co * K, 0.0f);
    std::fill(db, db + co, 0.0f);
  }
  for (std::int64_t n = 0; n < batch; ++n) {
    const float* dyn = dy + n * co * P;
    im2col(s, x + n * s.in_numel(), cols);
    sgemm(Trans::No, Trans::Yes, co, K, P, 1.0f, dyn, P, cols, P, 1.0f, dw, K);
    for (std::int64_t c = 0; c < co; ++c) {
      float sum = 0;
      for (std::int64_t p = 0; p < P; ++p) sum += dyn[c * P + p];
      db[c] += sum;
    }
    if (dx != nullptr) {
      sgemm(Trans::Yes, Trans::No, K, P, co, 1.0f, w, K, dyn, P, 0.0f, dcols, P);
      col2im(s, dcols, dx + n * s.in_numel());
    }
  }
}

std::unique_ptr<Layer> make_conv2d(const Conv2dShape& shape) {
  check_conv2d_shape(shape);
  return std::make_unique<Conv2d>(shape);
}

}  // namespace lockstep::nn
