// AdamW (decoupled weight decay): torch.optim.AdamW, single-tensor path.
// One pass over P floats: reads w, g, m, v; writes w, m, v.
#include <cmath>
#include <cstdio>
#include <string>

#include "lockstep/error.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {
namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(std::size_t numel, const AdamWOptions& o) : Optimizer(numel, 2), o_(o) {}

  std::string describe() const override {
    char buf[128];
    std::snprintf(buf, sizeof buf, "AdamW(betas=(%g, %g), eps=%g, weight_decay=%g)", o_.beta1, o_.beta2,
                  o_.eps, o_.weight_decay);
    return buf;
  }
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq"}; }

  void update(float* w, const float* g, float* zero, float lr, std::size_t at, std::size_t n) override {
    float* m = state_.span().data() + at;
    float* v = m + numel_;
    const float b1 = o_.beta1, b2 = o_.beta2, eps = o_.eps;
    const float decay = 1.0f - lr * o_.weight_decay;
    const double t = static_cast<double>(steps_ + 1);  // this step, 1-based
    const float bc1 = static_cast<float>(1.0 - std::pow(double(b1), t));
    const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double(b2), t)));
    const float step_size = lr / bc1;
    // m = lerp(m, g, 1 - b1) as torch's lerp_ computes it: from the nearer
    // end, so that b1 = 0 gives m = g exactly (m + (g - m) would not).
    const float weight = 1.0f - b1, rest = 1.0f - weight;
    const bool from_m = weight < 0.5f;
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      if (zero != nullptr) zero[i] = 0.0f;
      w[i] *= decay;
      m[i] = from_m ? m[i] + weight * (gi - m[i]) : gi - (gi - m[i]) * rest;
      v[i] = v[i] * b2 + (1.0f - b2) * gi * gi;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      w[i] -= step_size * m[i] / denom;
    }
  }

 private:
  AdamWOptions o_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(std::size_t numel, const AdamWOptions& options) {
  // Written so that NaN fails every test (a NaN would make every weight NaN).
  if (!(options.beta1 >= 0 && options.beta1 < 1) || !(options.beta2 >= 0 && options.beta2 < 1)) {
    throw InvalidArgument("AdamW betas must lie in [0, 1)");
  }
  if (!(options.eps > 0 && std::isfinite(options.eps)) ||
      !(options.weight_decay >= 0 && std::isfinite(options.weight_decay))) {
    throw InvalidArgument("AdamW eps must be positive and weight decay not negative");
  }
  return std::make_unique<AdamW>(numel, options);
}

}  // namespace lockstep::optim
