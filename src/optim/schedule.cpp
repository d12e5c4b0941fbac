#include <algorithm>
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

void Optimizer::restore(std::span<const float> state, std::int64_t steps_taken) {
  if (state.size() != state_.span().size() || steps_taken < 0) {
    throw InvalidArgument("optimizer state to restore holds " + std::to_string(state.size()) + " values and " +
                          std::to_string(steps_taken) + " steps, but this optimizer's state has " +
                          std::to_string(state_.span().size()) + " values");
  }
  if (state.data() != state_.span().data()) std::copy(state.begin(), state.end(), state_.span().begin());
  steps_ = steps_taken;
}

void Optimizer::step_ranges_and_zero_grads(std::span<float> params, std::span<float> grads,
                                           std::span<const ParamRange> ranges, float lr) {
  if (params.size() != grads.size()) {
    throw InvalidArgument("sharded optimizer step got " + std::to_string(params.size()) + " parameters and " +
                          std::to_string(grads.size()) + " gradients");
  }
  if (!std::isfinite(lr)) throw InvalidArgument("optimizer step with a learning rate of " + std::to_string(lr));
  std::size_t total = 0, end = 0;
  for (const auto& r : ranges) {
    if (r.offset < end || r.numel > params.size() || r.offset > params.size() - r.numel) {
      throw InvalidArgument("sharded optimizer step: range [" + std::to_string(r.offset) + ", +" +
                            std::to_string(r.numel) + ") overlaps the one before it or runs past " +
                            std::to_string(params.size()) + " parameters");
    }
    end = r.offset + r.numel;
    total += r.numel;
  }
  if (total != numel_) {
    throw InvalidArgument("sharded optimizer for " + std::to_string(numel_) + " parameters got ranges of " +
                          std::to_string(total));
  }
  std::size_t at = 0, cleared = 0;  // state position; gradients zeroed up to here
  for (const auto& r : ranges) {
    std::fill(grads.begin() + cleared, grads.begin() + r.offset, 0.0f);
    update(params.data() + r.offset, grads.data() + r.offset, grads.data() + r.offset, lr, at, r.numel);
    at += r.numel;
    cleared = r.offset + r.numel;
  }
  std::fill(grads.begin() + cleared, grads.end(), 0.0f);
  ++steps_;
}

std::size_t Optimizer::state_floats(std::size_t numel, std::size_t slots) {
  if (slots != 0 && numel > nn::kMaxFloats / slots) {
    throw InvalidArgument("optimizer state for " + std::to_string(numel) + " parameters x " + std::to_string(slots) +
                          " slots is more than any machine can hold");
  }
  return numel * slots;
}

float learning_rate(Schedule schedule, float base, std::int64_t step, std::int64_t total_steps,
                    std::int64_t warmup) {
  if (warmup > 0) {
    if (step < warmup) return static_cast<float>(double(base) * double(step + 1) / double(warmup));
    step -= warmup;
    total_steps -= warmup;
  }
  if (schedule == Schedule::Constant || total_steps <= 0) return base;
  const double progress = static_cast<double>(step) / static_cast<double>(total_steps);
  return static_cast<float>(base * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

}  // namespace lockstep::optim
