// Dropout(p): y = x . mask / (1 - p), dx = dy . mask / (1 - p); identity in
// evaluation. 1 flop per element each way.
//
// Note [Keyed dropout]
// The mask of element j of a sample is one Philox4x32-10 draw (philox.h):
//   key     = ctx.seed                      (two 32-bit words)
//   counter = (j / 4, ctx.step, sample lo, sample hi), word j % 4 of the result
//   kept    = draw >= p . 2^32
// where `sample` is the sample's global index (ctx.sample_index[row]); so
// steps below 2^32 and samples of fewer than 2^34 elements. Nothing
// depends on the rank, the replica count, the batch or the row, and no
// generator carries state from call to call: any replica computing that sample
// at that step draws the same mask, which is what bit-exact training across
// replica counts needs. backward() draws the mask again from the key the
// forward kept.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>

#include "lockstep/error.h"
#include "lockstep/nn/layer.h"
#include "lockstep/nn/philox.h"

namespace lockstep::nn {
namespace {

// The four draws of elements [4 block, 4 block + 4) of `sample` at `step`.
std::array<std::uint32_t, 4> draws(std::uint64_t seed, std::uint64_t step, std::uint64_t sample,
                                   std::uint64_t block) {
  return philox4x32_10({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(step),
                        static_cast<std::uint32_t>(sample), static_cast<std::uint32_t>(sample >> 32)},
                       {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

// Elements [0, features) of one sample: mask . scale into out (0 or scale).
void keyed_mask_row(std::uint64_t threshold, float scale, std::uint64_t seed, std::uint64_t step,
                    std::uint64_t sample, std::int64_t features, float* out) {
  for (std::int64_t j0 = 0; j0 < features; j0 += 4) {
    const auto r = draws(seed, step, sample, std::uint64_t(j0 / 4));
    for (std::int64_t j = j0; j < features && j < j0 + 4; ++j) out[j] = r[j - j0] >= threshold ? scale : 0.0f;
  }
}

std::uint64_t drop_threshold(float p) {
  return static_cast<std::uint64_t>(std::ldexp(static_cast<double>(p), 32));
}

class Dropout final : public Layer {
 public:
  Dropout(std::int64_t features, float p)
      : features_(features),
        p_(p),
        threshold_(drop_threshold(p)),
        scale_(p < 1.0f ? 1.0f / (1.0f - p) : 0.0f),
        mask_(static_cast<std::size_t>(features)) {}

  std::string describe() const override {
    char p[32];
    std::snprintf(p, sizeof p, "%g", static_cast<double>(p_));
    return std::string("Dropout(p=") + p + ")";
  }
  std::int64_t in_features() const override { return features_; }
  std::int64_t out_features() const override { return features_; }
  void set_training(bool training) override { training_ = training; }

  void forward(const float* x, float* y, std::int64_t batch, const ForwardContext& ctx) override {
    // x: (B, D) -> y: (B, D)
    LOCKSTEP_REQUIRE(ctx.sample_index.empty() || static_cast<std::int64_t>(ctx.sample_index.size()) == batch,
                     "Dropout: the ForwardContext has one sample index per row, or none");
    LOCKSTEP_REQUIRE(ctx.step < (std::uint64_t{1} << 32),
                     "Dropout: ForwardContext::step must be below 2^32, got " + std::to_string(ctx.step));
    forward_training_ = training_;
    seed_ = ctx.seed;
    step_ = ctx.step;
    samples_.assign(ctx.sample_index.begin(), ctx.sample_index.end());
    apply(x, y, batch);
  }
  void backward(const float* /*x*/, const float* /*y*/, const float* dy, float* dx, std::int64_t batch,
                bool /*accumulate*/) override {
    // dy: (B, D) -> dx: (B, D), through the forward's mask
    if (dx != nullptr) apply(dy, dx, batch);
  }

  double forward_flops(std::int64_t batch) const override { return double(batch) * features_; }
  double backward_flops(std::int64_t batch, bool need_dx) const override {
    return need_dx ? double(batch) * features_ : 0.0;
  }

 private:
  // out = in . mask . scale with the last forward's key and mode.
  void apply(const float* in, float* out, std::int64_t batch) {
    const std::int64_t n = batch * features_;
    if (!forward_training_ || p_ == 0.0f) {
      std::copy(in, in + n, out);
      return;
    }
    for (std::int64_t r = 0; r < batch; ++r) {
      const std::uint64_t sample = samples_.empty() ? std::uint64_t(r) : std::uint64_t(samples_[r]);
      keyed_mask_row(threshold_, scale_, seed_, step_, sample, features_, mask_.data());
      for (std::int64_t j = 0; j < features_; ++j) out[r * features_ + j] = in[r * features_ + j] * mask_[j];
    }
  }

  std::int64_t features_;
  float p_;
  std::uint64_t threshold_;
  float scale_;
  bool training_ = true;
  // The key and mode of the last forward, for the backward.
  bool forward_training_ = true;
  std::uint64_t seed_ = 0, step_ = 0;
  std::vector<std::int64_t> samples_;
  std::vector<float> mask_;  // scratch: one row's mask . scale
};

}  // namespace

bool dropout_keeps(float p, std::uint64_t seed, std::uint64_t step, std::uint64_t sample,
                   std::uint64_t element) {
  const auto r = draws(seed, step, sample, element / 4);
  return r[element % 4] >= drop_threshold(p);
}

std::unique_ptr<Layer> make_dropout(std::int64_t features, float p) {
  if (features <= 0) throw InvalidArgument("Dropout needs a positive width");
  if (!(p >= 0.0f && p <= 1.0f))
    throw InvalidArgument("Dropout p must be in [0, 1], got " + std::to_string(p));
  return std::make_unique<Dropout>(features, p);
}

}  // namespace lockstep::nn
