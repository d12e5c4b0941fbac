// MaxPool2d(kernel, stride), no padding, floor mode.
//
//   forward   y[n][c][oh][ow] = max over i, j < k of x[n][c][oh.s + i][ow.s + j]
//             (k.k - 1 comparisons per output; a NaN wins, the last one, as in PyTorch)
//   backward  dx = 0, then dx[argmax of each window] += dy[window]
//             The argmax (the first maximum in row-major order) is found again from
//             x, so the layer keeps no indices; overlapping windows add up.
#include <algorithm>
#include <cmath>
#include <string>

#include "lockstep/error.h"
#include "lockstep/nn/layer.h"

namespace lockstep::nn {
namespace {

class MaxPool2d final : public Layer {
 public:
  MaxPool2d(ImageShape in, std::int64_t kernel, std::int64_t stride)
      : in_(in),
        k_(kernel),
        s_(stride),
        ho_((in.height - kernel) / stride + 1),
        wo_((in.width - kernel) / stride + 1) {}

  std::string describe() const override {
    return "MaxPool2d(kernel_size=" + std::to_string(k_) + ", stride=" + std::to_string(s_) + ")";
  }
  std::int64_t in_features() const override { return in_.numel(); }
  std::int64_t out_features() const override { return in_.channels * ho_ * wo_; }

  void forward(const float* x, float* y, std::int64_t batch, const ForwardContext&) override {
    // x: (B, C, H, W) -> y: (B, C, Ho, Wo)
    for_each_window(x, batch, [&](std::int64_t out, std::int64_t in) { y[out] = x[in]; });
  }
  void backward(const float* x, const float* /*y*/, const float* dy, float* dx, std::int64_t batch,
                bool /*accumulate*/) override {
    // dy: (B, C, Ho, Wo) -> dx: (B, C, H, W)
    if (dx == nullptr) return;
    std::fill(dx, dx + batch * in_features(), 0.0f);
    for_each_window(x, batch, [&](std::int64_t out, std::int64_t in) { dx[in] += dy[out]; });
  }

  double forward_flops(std::int64_t batch) const override {
    return double(batch) * out_features() * (k_ * k_ - 1);
  }
  double backward_flops(std::int64_t batch, bool need_dx) const override {
    return need_dx ? double(batch) * out_features() * (k_ * k_) : 0.0;
  }

 private:
  // Calls f(output index, index in x of the window's maximum: the first one
  // in row-major order, or the last NaN, as PyTorch's CPU kernel).
  template <class F>
  void for_each_window(const float* x, std::int64_t batch, F&& f) const {
    const std::int64_t planes = batch * in_.channels, W = in_.width, hw = in_.height * W;
    const std::int64_t k = k_, s = s_, ho = ho_, wo = wo_;
    std::int64_t out = 0;
    for (std::int64_t p = 0; p < planes; ++p) {
      for (std::int64_t oh = 0; oh < ho; ++oh) {
        for (std::int64_t ow = 0; ow < wo; ++ow, ++out) {
          const std::int64_t first = p * hw + oh * s * W + ow * s;
          // Written for conditional moves, not branches: which element wins
          // is data-dependent, so a branch would mispredict half the time.
          std::int64_t best = first;
          float m = x[first];
          bool nan = false;
          for (std::int64_t i = 0; i < k; ++i) {
            for (std::int64_t j = 0; j < k; ++j) {
              const std::int64_t at = first + i * W + j;
              const float v = x[at];
              best = v > m ? at : best;
              nan |= v != v;
              m = std::max(m, v);
            }
          }
          if (nan) best = last_nan(x, first, W);
          f(out, best);
        }
      }
    }
  }
  std::int64_t last_nan(const float* x, std::int64_t first, std::int64_t W) const {
    std::int64_t at = first;
    for (std::int64_t i = 0; i < k_; ++i)
      for (std::int64_t j = 0; j < k_; ++j)
        if (std::isnan(x[first + i * W + j])) at = first + i * W + j;
    return at;
  }

  ImageShape in_;
  std::int64_t k_, s_, ho_, wo_;
};

}  // namespace

std::unique_ptr<Layer> make_max_pool2d(ImageShape in, std::int64_t kernel, std::int64_t stride) {
  if (stride == 0) stride = kernel;
  if (in.channels <= 0 || in.height <= 0 || in.width <= 0 || kernel <= 0 || stride <= 0)
    throw InvalidArgument("MaxPool2d needs positive sizes, kernel and stride");
  if (kernel > in.height || kernel > in.width)
    throw InvalidArgument("MaxPool2d kernel " + std::to_string(kernel) + " is larger than the " +
                          std::to_string(in.height) + "x" + std::to_string(in.width) + " input");
  return std::make_unique<MaxPool2d>(in, kernel, stride);
}

}  // namespace lockstep::nn
