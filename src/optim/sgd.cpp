// SGD with momentum, dampening, weight decay and Nesterov: torch.optim.SGD.
// One pass over P floats: reads w, g, buf; writes w, buf.
#include <cmath>
#include <cstdio>
#include <string>

#include "lockstep/error.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(std::size_t numel, const SgdOptions& o) : Optimizer(numel, o.momentum != 0.0f ? 1 : 0), o_(o) {}

  std::string describe() const override {
    char buf[128];
    std::snprintf(buf, sizeof buf, "SGD(momentum=%g, weight_decay=%g%s)", o_.momentum, o_.weight_decay,
                  o_.nesterov ? ", nesterov" : "");
    return buf;
  }
  std::vector<std::string> slot_names() const override {
    if (o_.momentum == 0.0f) return {};
    return {"momentum_buffer"};
  }

  void update(float* w, const float* g, float* zero, float lr, std::size_t at, std::size_t n) override {
    if (zero != nullptr) {
      run<true>(w, g, zero, lr, at, n);
    } else {
      run<false>(w, g, nullptr, lr, at, n);
    }
  }

 private:
  template <bool kZero>
  void run(float* w, const float* g, float* zero, float lr, std::size_t at, std::size_t n) {
    float* buf = state_.span().data() + at;
    const float wd = o_.weight_decay, mu = o_.momentum, damp = 1.0f - o_.dampening;
    const bool nesterov = o_.nesterov;
    if (mu == 0.0f) {
      for (std::size_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * w[i];
        if constexpr (kZero) zero[i] = 0.0f;
        w[i] -= lr * d;
      }
    } else if (steps_ == 0) {
      for (std::size_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * w[i];
        if constexpr (kZero) zero[i] = 0.0f;
        buf[i] = d;
        w[i] -= lr * (nesterov ? d + mu * d : d);
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * w[i];
        if constexpr (kZero) zero[i] = 0.0f;
        const float b = mu * buf[i] + damp * d;
        buf[i] = b;
        w[i] -= lr * (nesterov ? d + mu * b : b);
      }
    }
  }

  SgdOptions o_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(std::size_t numel, const SgdOptions& options) {
  // Written so that NaN fails every test (a NaN would make every weight NaN).
  if (!(options.momentum >= 0 && std::isfinite(options.momentum)) ||
      !(options.weight_decay >= 0 && std::isfinite(options.weight_decay)) ||
      !(options.dampening >= 0 && options.dampening <= 1)) {
    throw InvalidArgument("SGD momentum and weight decay must be finite and not negative, and dampening in [0, 1]");
  }
  if (options.nesterov && (options.momentum == 0.0f || options.dampening != 0.0f)) {
    throw InvalidArgument("Nesterov momentum needs a momentum > 0 and zero dampening");
  }
  return std::make_unique<Sgd>(numel, options);
}

}  // namespace lockstep::optim
