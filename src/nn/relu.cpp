// ReLU: y = max(x, 0); dx = dy where y > 0, else 0. No parameters.
// NaN goes through both ways, as in PyTorch (clamp_min(x, 0), then
// threshold_backward(dy, y, 0): dy unless y <= 0): a NaN activation reaches
// the loss, where the guards see it, instead of becoming a silent 0.
#include <string>

#include "lockstep/error.h"
#include "lockstep/nn/layer.h"

namespace lockstep::nn {
namespace {

class Relu final : public Layer {
 public:
  explicit Relu(std::int64_t features) : features_(features) {}
  std::string describe() const override { return "ReLU()"; }
  std::int64_t in_features() const override { return features_; }
  std::int64_t out_features() const override { return features_; }

  void forward(const float* x, float* y, std::int64_t batch, const ForwardContext&) override {
    // x: (B, D) -> y: (B, D)
    const std::int64_t n = batch * features_;
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] <= 0.0f ? 0.0f : x[i];
  }
  void backward(const float* /*x*/, const float* y, const float* dy, float* dx, std::int64_t batch,
                bool /*accumulate*/) override {
    if (dx == nullptr) return;
    const std::int64_t n = batch * features_;
    for (std::int64_t i = 0; i < n; ++i) dx[i] = y[i] <= 0.0f ? 0.0f : dy[i];
  }

 private:
  std::int64_t features_;
};

}  // namespace

std::unique_ptr<Layer> make_relu(std::int64_t features) {
  if (features <= 0) throw InvalidArgument("ReLU needs a positive width, got " + std::to_string(features));
  return std::make_unique<Relu>(features);
}

}  // namespace lockstep::nn
