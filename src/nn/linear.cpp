// Linear layer: y = x W^T + b, W: (out, in), b: (out).
//
//   forward   y  (B, out) = x (B, in) . W^T            2.B.in.out flops
//   backward  dW (out, in) = dy^T (out, B) . x (B, in)  2.B.in.out flops
//             db (out)     = sum over rows of dy
//             dx (B, in)   = dy (B, out) . W (out, in)  2.B.in.out flops, if needed
#include <cmath>
#include <string>

#include "lockstep/nn/gemm.h"
#include "lockstep/error.h"
#include "lockstep/nn/layer.h"

namespace lockstep::nn {
namespace {

class Linear final : public Layer {
 public:
  Linear(std::int64_t in, std::int64_t out) : in_(in), out_(out) {}

  std::string describe() const override {
    return "Linear(" + std::to_string(in_) + ", " + std::to_string(out_) + ")";
  }
  std::int64_t in_features() const override { return in_; }
  std::int64_t out_features() const override { return out_; }

  std::vector<ParamDecl> params() const override { return {{"weight", {out_, in_}}, {"bias", {out_}}}; }
  void bind(std::span<float* const> params, std::span<float* const> grads) override {
    w_ = params[0];
    b_ = params[1];
    dw_ = grads[0];
    db_ = grads[1];
  }
  void init(std::mt19937_64& rng) override {
    // U(-bound, bound) from the top 24 bits of each draw: the same values with
    // every standard library (std::uniform_real_distribution is not specified
    // bit for bit).
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
    auto u = [&] { return (static_cast<float>(rng() >> 40) * 0x1.0p-24f * 2.0f - 1.0f) * bound; };
    for (std::int64_t i = 0; i < out_ * in_; ++i) w_[i] = u();
    for (std::int64_t i = 0; i < out_; ++i) b_[i] = u();
  }

  void forward(const float* x, float* y, std::int64_t batch, const ForwardContext&) override {
    // x: (B, in) -> y: (B, out)
    for (std::int64_t r = 0; r < batch; ++r) {
      float* row = y + r * out_;
      for (std::int64_t j = 0; j < out_; ++j) row[j] = b_[j];
    }
    sgemm(Trans::No, Trans::Yes, batch, out_, in_, 1.0f, x, in_, w_, in_, 1.0f, y, out_);
  }

  void backward(const float* x, const float* /*y*/, const float* dy, float* dx, std::int64_t batch,
                bool accumulate) override {
    // dy: (B, out) -> dW: (out, in), db: (out), dx: (B, in)
    const float beta = accumulate ? 1.0f : 0.0f;
    if (batch == 0) {
      if (!accumulate) {
        for (std::int64_t i = 0; i < out_ * in_; ++i) dw_[i] = 0;
        for (std::int64_t j = 0; j < out_; ++j) db_[j] = 0;
      }
      return;
    }
    sgemm(Trans::Yes, Trans::No, out_, in_, batch, 1.0f, dy, out_, x, in_, beta, dw_, in_);
    if (!accumulate)
      for (std::int64_t j = 0; j < out_; ++j) db_[j] = 0;
    for (std::int64_t r = 0; r < batch; ++r) {
      const float* row = dy + r * out_;
      for (std::int64_t j = 0; j < out_; ++j) db_[j] += row[j];
    }
    if (dx != nullptr) sgemm(Trans::No, Trans::No, batch, in_, out_, 1.0f, dy, out_, w_, in_, 0.0f, dx, in_);
  }

  double forward_flops(std::int64_t batch) const override { return 2.0 * batch * in_ * out_; }
  double backward_flops(std::int64_t batch, bool need_dx) const override {
    return (need_dx ? 4.0 : 2.0) * batch * in_ * out_;
  }

 private:
  std::int64_t in_, out_;
  float* w_ = nullptr;
  float* b_ = nullptr;
  float* dw_ = nullptr;
  float* db_ = nullptr;
};

}  // namespace

std::unique_ptr<Layer> make_linear(std::int64_t in_features, std::int64_t out_features) {
  if (in_features <= 0 || out_features <= 0) {
    throw InvalidArgument("Linear needs positive widths, got " + std::to_string(in_features) + " -> " +
                          std::to_string(out_features));
  }
  return std::make_unique<Linear>(in_features, out_features);
}

}  // namespace lockstep::nn
