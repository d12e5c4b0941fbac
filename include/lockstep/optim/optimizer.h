// Optimizers, with PyTorch's update rules, over one replica's arenas.
//
// An optimizer owns its state in one contiguous arena of `slots() x P` floats
// (P = number of parameters), laid out like the parameters, so the state is
// replicated exactly as the weights are. step() applies one update to every
// parameter from the (already averaged) gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/nn/arena.h"

namespace lockstep::optim {

// A run of parameters [offset, offset + numel) in the parameter arena.
struct ParamRange {
  std::size_t offset = 0, numel = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string describe() const = 0;
  // Names of the state slots, e.g. {"momentum_buffer"} or {"exp_avg", "exp_avg_sq"}.
  virtual std::vector<std::string> slot_names() const = 0;
  std::span<float> state() { return state_.span(); }
  std::span<const float> state() const { return state_.span(); }
  std::int64_t steps_taken() const { return steps_; }
  // Replaces the state and the count of steps taken, to go on from a
  // checkpoint (AdamW's bias correction counts the steps). InvalidArgument
  // unless `state` is state().size() long and `steps_taken` >= 0. `state`
  // may be state() itself (only the count changes).
  void restore(std::span<const float> state, std::int64_t steps_taken);
  std::size_t numel() const { return numel_; }

  // params -= update(grads) with learning rate `lr`.
  void step(std::span<float> params, std::span<const float> grads, float lr) {
    check_step(params.size(), grads.size(), lr);
    update(params.data(), grads.data(), nullptr, lr, 0, numel_);
    ++steps_;
  }
  // The same update, and every gradient set to 0 in the same pass over
  // memory (PyTorch's zero_grad), so that the next backward accumulates into
  // them. That spares the separate pass over the gradients that a backward
  // overwriting them would make (OpenBLAS clears C before a beta = 0 product).
  void step_and_zero_grads(std::span<float> params, std::span<float> grads, float lr) {
    check_step(params.size(), grads.size(), lr);
    update(params.data(), grads.data(), grads.data(), lr, 0, numel_);
    ++steps_;
  }
  // Sharded (ZeRO-1, docs/design.md): this optimizer's state covers only
  // `ranges` of the parameters, in that order (numel() is their total), so
  // it updates only those; and it sets every gradient to 0, in the ranges
  // and between them. The ranges must be in increasing order, disjoint and
  // inside `params` (InvalidArgument otherwise). The update of each element
  // is the same arithmetic as step_and_zero_grads', so the same bits.
  void step_ranges_and_zero_grads(std::span<float> params, std::span<float> grads,
                                  std::span<const ParamRange> ranges, float lr);

 protected:
  Optimizer(std::size_t numel, std::size_t slots) : numel_(numel), state_(state_floats(numel, slots)) {}
  // One update of n parameters w[0..n) whose state is at element `at` of
  // each slot (slot s at s x numel_ + at); if `zero` is not null, zero[i] = 0
  // after g[i] is read (zero == g when called from step_and_zero_grads).
  // steps_ counts the steps before this one; the caller advances it.
  virtual void update(float* w, const float* g, float* zero, float lr, std::size_t at, std::size_t n) = 0;
  // InvalidArgument unless params and grads are numel_ long and lr is finite.
  void check_step(std::size_t params, std::size_t grads, float lr) const;
  // numel x slots, or InvalidArgument if that is past nn::kMaxFloats.
  static std::size_t state_floats(std::size_t numel, std::size_t slots);
  std::size_t numel_;
  nn::Arena state_;
  std::int64_t steps_ = 0;
};

// torch.optim.SGD: g += wd*w; buf = g (first step) or momentum*buf + (1-dampening)*g;
// g = g + momentum*buf (Nesterov) or buf; w -= lr*g.
struct SgdOptions {
  float momentum = 0.9f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

// torch.optim.AdamW: w *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = b2 v + (1-b2) g^2;
// w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

std::unique_ptr<Optimizer> make_sgd(std::size_t numel, const SgdOptions& options);
std::unique_ptr<Optimizer> make_adamw(std::size_t numel, const AdamWOptions& options);

enum class Schedule { Constant, Cosine };
// Learning rate at `step` (0-based) of `total_steps`: constant, or cosine decay
// from `base` to 0 (torch CosineAnnealingLR with T_max = total_steps, eta_min 0).
// With `warmup` W > 0, the first W steps ramp linearly, base x (step + 1) / W
// (torch LinearLR(start_factor = 1/W, total_iters = W - 1)), and the schedule
// runs over the other total_steps - W steps as over a run of that length
// (torch SequentialLR with milestones = [W]).
float learning_rate(Schedule schedule, float base, std::int64_t step, std::int64_t total_steps,
                    std::int64_t warmup = 0);

}  // namespace lockstep::optim
