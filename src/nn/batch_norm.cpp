// BatchNorm2d over NCHW images; per channel c, over the N = B.H.W values x_i:
//
//   training  mean = sum x_i / N,  var = sum (x_i - mean)^2 / N   (biased; double)
//             invstd = 1 / sqrt(var + eps),  xhat_i = (x_i - mean) . invstd
//             y_i = gamma . xhat_i + beta
//             running_mean = (1 - m) running_mean + m mean
//             running_var  = (1 - m) running_var  + m var . N / (N - 1)   (unbiased)
//             num_batches_tracked += 1                                    (PyTorch's formulas)
//   eval      the same y with mean = running_mean, var = running_var; buffers unchanged
//
//   backward  dbeta  += sum dy_i,  dgamma += sum dy_i . xhat_i
//             dx_i = gamma . invstd . (dy_i - sum dy / N - xhat_i . sum (dy . xhat) / N)   training
//             dx_i = gamma . invstd . dy_i                                                  eval
// The forward keeps mean and invstd per channel (2.C doubles) for the backward,
// which recomputes xhat from x.
//
// Flops per element: forward 5 (sum; square of the difference; scale and shift),
// backward 5 for the sums and the parameter gradients, 4 more for dx.
#include <algorithm>
#include <cmath>
#include <string>

#include "lockstep/error.h"
#include "lockstep/nn/layer.h"

namespace lockstep::nn {
namespace {

constexpr double kEps = 1e-5, kMomentum = 0.1;

class BatchNorm2d final : public Layer {
 public:
  explicit BatchNorm2d(ImageShape s)
      : s_(s), mean_(static_cast<std::size_t>(s.channels)), invstd_(static_cast<std::size_t>(s.channels)) {}

  std::string describe() const override { return "BatchNorm2d(" + std::to_string(s_.channels) + ")"; }
  std::int64_t in_features() const override { return s_.numel(); }
  std::int64_t out_features() const override { return s_.numel(); }

  std::vector<ParamDecl> params() const override {
    return {{"weight", {s_.channels}}, {"bias", {s_.channels}}};
  }
  void bind(std::span<float* const> params, std::span<float* const> grads) override {
    gamma_ = params[0];
    beta_ = params[1];
    dgamma_ = grads[0];
    dbeta_ = grads[1];
  }
  std::vector<ParamDecl> buffers() const override {
    return {{"running_mean", {s_.channels}}, {"running_var", {s_.channels}}, {"num_batches_tracked", {}}};
  }
  void bind_buffers(std::span<float* const> buffers) override {
    running_mean_ = buffers[0];
    running_var_ = buffers[1];
    num_batches_tracked_ = buffers[2];
  }
  void init(std::mt19937_64& /*rng*/) override {
    for (std::int64_t c = 0; c < s_.channels; ++c) {
      gamma_[c] = 1;
      beta_[c] = 0;
      running_mean_[c] = 0;
      running_var_[c] = 1;
    }
    *num_batches_tracked_ = 0;
  }
  void set_training(bool training) override { training_ = training; }

  void forward(const float* x, float* y, std::int64_t batch, const ForwardContext& ctx) override {
    // x: (B, C, H, W) -> y: (B, C, H, W). Statistics over the first
    // `samples_` rows; the rest are padding (ForwardContext::samples).
    forward_training_ = training_;
    samples_ = ctx.samples < 0 ? batch : std::min(ctx.samples, batch);
    if (batch == 0) return;
    const std::int64_t C = s_.channels, hw = s_.height * s_.width, n = samples_ * hw;
    if (training_ && samples_ == 0) {  // padding only: nothing to learn from, y = x
      std::fill(mean_.begin(), mean_.end(), 0.0);
      std::fill(invstd_.begin(), invstd_.end(), 1.0);
      std::copy(x, x + batch * C * hw, y);
      return;
    }
    if (training_ && n < 2)
      throw InvalidArgument("BatchNorm2d needs more than 1 value per channel when training, got " +
                            std::to_string(n));
    for (std::int64_t c = 0; c < C; ++c) {
      double mean, var;
      if (training_) {
        double sum = 0;
        for (std::int64_t b = 0; b < samples_; ++b)
          for (const float* p = x + (b * C + c) * hw; p != x + (b * C + c + 1) * hw; ++p) sum += *p;
        mean = sum / double(n);
        double sq = 0;
        for (std::int64_t b = 0; b < samples_; ++b)
          for (const float* p = x + (b * C + c) * hw; p != x + (b * C + c + 1) * hw; ++p)
            sq += (*p - mean) * (*p - mean);
        var = sq / double(n);
        running_mean_[c] = static_cast<float>((1 - kMomentum) * running_mean_[c] + kMomentum * mean);
        running_var_[c] = static_cast<float>((1 - kMomentum) * running_var_[c] +
                                             kMomentum * var * double(n) / double(n - 1));
      } else {
        mean = running_mean_[c];
        var = running_var_[c];
      }
      const double invstd = 1.0 / std::sqrt(var + kEps);
      mean_[c] = mean;
      invstd_[c] = invstd;
      // y = x . scale + shift, with scale = gamma . invstd, shift = beta - mean . scale.
      const float scale = static_cast<float>(gamma_[c] * invstd);
      const float shift = static_cast<float>(beta_[c] - mean * gamma_[c] * invstd);
      for (std::int64_t b = 0; b < batch; ++b) {
        const float* xp = x + (b * C + c) * hw;
        float* yp = y + (b * C + c) * hw;
        for (std::int64_t i = 0; i < hw; ++i) yp[i] = xp[i] * scale + shift;
      }
    }
    if (training_) *num_batches_tracked_ += 1;
  }

  void backward(const float* x, const float* /*y*/, const float* dy, float* dx, std::int64_t batch,
                bool accumulate) override {
    // dy: (B, C, H, W) -> dgamma: (C), dbeta: (C), dx: (B, C, H, W)
    // The padding rows (past samples_) took no part in the statistics: they
    // add nothing to dgamma and dbeta, and get no input gradient.
    const std::int64_t C = s_.channels, hw = s_.height * s_.width, rows = std::min(samples_, batch), n = rows * hw;
    if (dx != nullptr) std::fill(dx + rows * C * hw, dx + batch * C * hw, 0.0f);
    for (std::int64_t c = 0; c < C; ++c) {
      double sum_dy = 0, sum_dy_xhat = 0;
      const double mean = mean_[c], invstd = invstd_[c];
      for (std::int64_t b = 0; b < rows; ++b) {
        const float* xp = x + (b * C + c) * hw;
        const float* dp = dy + (b * C + c) * hw;
        for (std::int64_t i = 0; i < hw; ++i) {
          sum_dy += dp[i];
          sum_dy_xhat += dp[i] * ((xp[i] - mean) * invstd);
        }
      }
      dgamma_[c] = static_cast<float>(sum_dy_xhat + (accumulate ? dgamma_[c] : 0.0));
      dbeta_[c] = static_cast<float>(sum_dy + (accumulate ? dbeta_[c] : 0.0));
      if (dx == nullptr || n == 0) continue;
      const double k = gamma_[c] * invstd;
      const double mean_dy = forward_training_ ? sum_dy / double(n) : 0.0;
      const double mean_dy_xhat = forward_training_ ? sum_dy_xhat / double(n) : 0.0;
      for (std::int64_t b = 0; b < rows; ++b) {
        const float* xp = x + (b * C + c) * hw;
        const float* dp = dy + (b * C + c) * hw;
        float* dxp = dx + (b * C + c) * hw;
        for (std::int64_t i = 0; i < hw; ++i)
          dxp[i] = static_cast<float>(k * (dp[i] - mean_dy - (xp[i] - mean) * invstd * mean_dy_xhat));
      }
    }
  }

  double forward_flops(std::int64_t batch) const override { return 5.0 * batch * s_.numel(); }
  double backward_flops(std::int64_t batch, bool need_dx) const override {
    return (need_dx ? 9.0 : 5.0) * batch * s_.numel();
  }

 private:
  ImageShape s_;
  bool training_ = true;
  bool forward_training_ = true;       // the mode of the last forward
  std::vector<double> mean_, invstd_;  // per channel, of the last forward
  std::int64_t samples_ = 0;           // rows of the last forward that were samples
  float* gamma_ = nullptr;
  float* beta_ = nullptr;
  float* dgamma_ = nullptr;
  float* dbeta_ = nullptr;
  float* running_mean_ = nullptr;
  float* running_var_ = nullptr;
  float* num_batches_tracked_ = nullptr;
};

}  // namespace

std::unique_ptr<Layer> make_batch_norm2d(ImageShape shape) {
  if (shape.channels <= 0 || shape.height <= 0 || shape.width <= 0)
    throw InvalidArgument("BatchNorm2d needs positive channels and sizes");
  return std::make_unique<BatchNorm2d>(shape);
}

}  // namespace lockstep::nn
