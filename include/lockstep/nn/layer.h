// Layers: plain classes around plain math.
//
// A layer maps a batch x: (B, in_features) to y: (B, out_features), row-major.
// Image layers read each row as one NCHW image, (C, H, W) flattened, exactly
// PyTorch's memory order, so a (B, 784) batch is a (B, 1, 28, 28) batch.
// backward() takes the upstream gradient dy and
//   - writes (accumulate == false) or adds (accumulate == true) the gradients
//     of the layer's parameters into the storage given to bind();
//   - writes dx: (B, in_features) unless dx is null (the input needs no grad).
// backward() must follow the forward() of the same batch (x, y and the
// context); a layer may keep small per-channel results of that forward
// (BatchNorm's batch statistics, Dropout's key) but no activations: the Model
// keeps x and y for them.
//
// Buffers are state that is not trained (BatchNorm's running statistics).
// They are declared like parameters, bound to their own arena, have no
// gradient, and change only in a training-mode forward().
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "lockstep/nn/conv2d.h"

namespace lockstep::nn {

struct ParamDecl {
  std::string name;  // relative to the layer, e.g. "weight"
  std::vector<std::int64_t> shape;
};

// What one forward pass knows besides its input: the key of its random
// streams (Note [Keyed dropout] in dropout.cpp). The default suits layers
// without randomness and evaluation.
struct ForwardContext {
  std::uint64_t seed = 0;  // the run's seed
  std::uint64_t step = 0;  // the optimizer step; must be < 2^32
  // The global sample index of each row of the batch: empty (rows are samples
  // 0..B-1) or exactly B entries. Read during forward() only.
  std::span<const std::int64_t> sample_index = {};
  // How many of the batch's rows, the first ones, are samples; the rest are
  // padding (--ragged pad), which batch statistics (BatchNorm) leave out and
  // which get no input gradient there. -1: every row.
  std::int64_t samples = -1;
};

// One image of a batch, NCHW: (channels, height, width).
struct ImageShape {
  std::int64_t channels = 1, height = 1, width = 1;
  std::int64_t numel() const { return channels * height * width; }
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string describe() const = 0;  // e.g. "Linear(784, 512)"
  virtual std::int64_t in_features() const = 0;
  virtual std::int64_t out_features() const = 0;

  virtual std::vector<ParamDecl> params() const { return {}; }
  // One pointer per declared parameter, in declaration order.
  virtual void bind(std::span<float* const> /*params*/, std::span<float* const> /*grads*/) {}
  virtual std::vector<ParamDecl> buffers() const { return {}; }
  // One pointer per declared buffer, in declaration order.
  virtual void bind_buffers(std::span<float* const> /*buffers*/) {}
  // Fills the bound parameters, drawing from `rng` in a fixed order, and
  // resets the bound buffers.
  virtual void init(std::mt19937_64& /*rng*/) {}
  // Training mode (the default) or evaluation mode, as PyTorch's
  // Module.train(): BatchNorm uses batch statistics and updates its running
  // statistics, Dropout drops. Evaluation is deterministic and leaves buffers.
  virtual void set_training(bool /*training*/) {}

  virtual void forward(const float* x, float* y, std::int64_t batch, const ForwardContext& ctx = {}) = 0;
  virtual void backward(const float* x, const float* y, const float* dy, float* dx, std::int64_t batch,
                        bool accumulate) = 0;

  // Floating-point operations the math needs (2 per multiply-add; 1 per
  // comparison or elementwise add/multiply). Training-mode counts.
  virtual double forward_flops(std::int64_t /*batch*/) const { return 0; }
  virtual double backward_flops(std::int64_t /*batch*/, bool /*need_dx*/) const { return 0; }
};

// y = x W^T + b with W: (out, in) and b: (out), PyTorch's nn.Linear layout.
// Init as PyTorch: W, b ~ U(-1/sqrt(in), 1/sqrt(in)).
std::unique_ptr<Layer> make_linear(std::int64_t in_features, std::int64_t out_features);

// y = max(x, 0); NaN stays NaN and passes its gradient, as in PyTorch.
std::unique_ptr<Layer> make_relu(std::int64_t features);

// PyTorch's nn.Conv2d on images of `shape` (see conv2d.h): weight
// (out, in, k, k), bias (out). Init as PyTorch: U(-1/sqrt(in.k.k), +).
// Fast path im2col + sgemm, one image at a time, so a sample's output does
// not depend on its batch or its position in it.
std::unique_ptr<Layer> make_conv2d(const Conv2dShape& shape);

// PyTorch's nn.MaxPool2d(kernel, stride), no padding, floor mode: each output
// is the max of a kernel x kernel window; the gradient goes to the first
// maximum of the window in row-major order. stride 0 means stride = kernel.
std::unique_ptr<Layer> make_max_pool2d(ImageShape in, std::int64_t kernel, std::int64_t stride = 0);

// PyTorch's nn.BatchNorm2d(C) with eps 1e-5 and momentum 0.1.
// Parameters weight (C) = 1, bias (C) = 0; buffers running_mean (C) = 0,
// running_var (C) = 1, num_batches_tracked (scalar, held as a float: exact
// up to 2^24 steps) = 0.
// Training: normalises with the batch mean and biased variance over
// (B, H, W); then running = 0.9 running + 0.1 batch (unbiased variance) and
// num_batches_tracked += 1. Needs B.H.W > 1; an empty batch changes nothing.
// Evaluation: normalises with the running statistics.
std::unique_ptr<Layer> make_batch_norm2d(ImageShape shape);

// PyTorch's nn.Dropout(p), p in [0, 1]. Training: y = x / (1 - p) where the
// element is kept, else 0; whether element j of a sample is kept depends only
// on (ctx.seed, ctx.step, the sample's global index, j), never on the rank,
// the batch or the row. Evaluation: y = x.
std::unique_ptr<Layer> make_dropout(std::int64_t features, float p);

// Whether Dropout(p) keeps element `element` of sample `sample` at `step`.
// The mask as a pure function, for tests and tools.
bool dropout_keeps(float p, std::uint64_t seed, std::uint64_t step, std::uint64_t sample,
                   std::uint64_t element);

// y = x: (B, C, H, W) read as (B, C.H.W), PyTorch's nn.Flatten. Our rows are
// flat already; the layer exists so that layer indices, hence parameter
// names, match the PyTorch nn.Sequential.
std::unique_ptr<Layer> make_flatten(std::int64_t features);

}  // namespace lockstep::nn
