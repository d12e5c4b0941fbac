// Flatten: (B, C, H, W) -> (B, C.H.W). Our rows are flat already, so it is a
// copy; it keeps layer indices (hence parameter names) in step with PyTorch.
#include <algorithm>
#include <string>

#include "lockstep/error.h"
#include "lockstep/nn/layer.h"

namespace lockstep::nn {
namespace {

class Flatten final : public Layer {
 public:
  explicit Flatten(std::int64_t features) : features_(features) {}
  std::string describe() const override { return "Flatten()"; }
  std::int64_t in_features() const override { return features_; }
  std::int64_t out_features() const override { return features_; }

  void forward(const float* x, float* y, std::int64_t batch, const ForwardContext&) override {
    // x: (B, C, H, W) -> y: (B, C.H.W)
    std::copy(x, x + batch * features_, y);
  }
  void backward(const float* /*x*/, const float* /*y*/, const float* dy, float* dx, std::int64_t batch,
                bool /*accumulate*/) override {
    // dy: (B, C.H.W) -> dx: (B, C, H, W)
    if (dx != nullptr) std::copy(dy, dy + batch * features_, dx);
  }

 private:
  std::int64_t features_;
};

}  // namespace

std::unique_ptr<Layer> make_flatten(std::int64_t features) {
  if (features <= 0) throw InvalidArgument("Flatten needs a positive width, got " + std::to_string(features));
  return std::make_unique<Flatten>(features);
}

}  // namespace lockstep::nn
