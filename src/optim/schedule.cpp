#include <cmath>
#include <numbers>

#include "lockstep/error.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {

void Optimizer::check_step(std::size_t params, std::size_t grads, float lr) const {
  if (params != numel_ || grads != numel_) {
    throw InvalidArgument("optimizer for " + std::to_string(numel_) + " parameters got " +
                          std::to_string(params) + " parameters and " + std::to_string(grads) + " gradients");
  }
  if (!std::isfinite(lr)) throw InvalidArgument("optimizer step with a learning rate of " + std::to_string(lr));
}

std::size_t Optimizer::state_floats(std::size_t numel, std::size_t slots) {
  if (slots != 0 && numel > nn::kMaxFloats / slots) {
    throw InvalidArgument("optimizer state for " + std::to_string(numel) + " parameters x " + std::to_string(slots) +
                          " slots is more than any machine can hold");
  }
  return numel * slots;
}

float learning_rate(Schedule schedule, float base, std::int64_t step, std::int64_t total_steps) {
  if (schedule == Schedule::Constant || total_steps <= 0) return base;
  const double progress = static_cast<double>(step) / static_cast<double>(total_steps);
  return static_cast<float>(base * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

}  // namespace lockstep::optim
