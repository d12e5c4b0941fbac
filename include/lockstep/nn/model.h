// A sequential model: layers in a chain, their parameters and gradients in
// two arenas, their buffers (state that is not trained, e.g. BatchNorm's
// running statistics) in a third, and the activations of the last forward pass.
//
// Parameter names follow PyTorch's nn.Sequential: "<layer index>.<param>",
// e.g. "0.weight", "0.bias", "2.weight" for Linear/ReLU/Linear, so a saved
// state loads directly into the equivalent PyTorch module. Buffers are named
// the same way ("1.running_mean") in their own layout.
//
// A Model is one replica's copy. It is not thread-safe; one thread drives it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/nn/arena.h"
#include "lockstep/nn/layer.h"

namespace lockstep::nn {

class Model {
 public:
  explicit Model(std::vector<std::unique_ptr<Layer>> layers);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const Layout& layout() const { return layout_; }
  std::span<float> params() { return params_.span(); }
  std::span<const float> params() const { return params_.span(); }
  std::span<float> grads() { return grads_.span(); }
  std::span<const float> grads() const { return grads_.span(); }
  // Buffers: no gradient, changed only by a training-mode forward(). Empty
  // for a model without any (an MLP).
  const Layout& buffer_layout() const { return buffer_layout_; }
  std::span<float> buffers() { return buffers_.span(); }
  std::span<const float> buffers() const { return buffers_.span(); }
  std::int64_t in_features() const;
  std::int64_t out_features() const;

  // Deterministic initialisation from `seed` (PyTorch's default schemes);
  // resets the buffers too.
  void init(std::uint64_t seed);

  // Training mode (the default) or evaluation mode for every layer, as
  // PyTorch's Module.train(bool) / eval(): see Layer::set_training.
  void set_training(bool training);
  bool training() const { return training_; }

  // x: (B, in) -> logits: (B, out). The span stays valid until the next call.
  // Keeps the activations that backward() needs; `x` itself must stay valid
  // until backward() returns.
  // `layer_done(i)`, if given, is called after each layer.
  // `ctx` keys the random streams (Dropout): pass the run's seed, the step and
  // each row's global sample index when training with randomness; the
  // default (seed 0, step 0, rows 0..B-1) gives the same mask every call.
  std::span<const float> forward(std::span<const float> x, std::int64_t batch,
                                 const std::function<void(std::size_t layer)>& layer_done = {},
                                 const ForwardContext& ctx = {});
  // dlogits: (B, out). Writes (or, with accumulate, adds to) grads().
  // Must follow forward() with the same batch. The input gets no gradient.
  // `layer_done(i)`, if given, is called as soon as layer i's parameter
  // gradients are final, last layer first: the reducer's "ready" events.
  void backward(std::span<const float> dlogits, std::int64_t batch, bool accumulate = false,
                const std::function<void(std::size_t layer)>& layer_done = {});

  std::size_t layer_count() const { return layers_.size(); }
  const Layer& layer(std::size_t i) const { return *layers_[i]; }
  // Layer i's tensors are layout().tensors()[first, end).
  struct TensorRange {
    std::size_t first = 0, end = 0;
  };
  TensorRange layer_tensors(std::size_t i) const { return layer_tensors_[i]; }

  // Forward + backward flops per sample that the math needs (no input grad).
  double train_flops_per_sample() const;
  double forward_flops_per_sample() const;
  std::string describe() const;

 private:
  void reserve(std::int64_t batch);

  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<TensorRange> layer_tensors_;
  Layout layout_;
  Arena params_;
  Arena grads_;
  Layout buffer_layout_;
  Arena buffers_;
  bool training_ = true;
  std::vector<std::vector<float>> acts_;  // acts_[i] = output of layer i
  const float* input_ = nullptr;          // the last input batch (not owned)
  std::int64_t forward_batch_ = -1;       // its rows; backward must be of the same batch
  std::vector<float> dbuf_[2];            // ping-pong upstream gradients
  std::int64_t capacity_ = 0;
};

// Linear(in, h0) ReLU Linear(h0, h1) ReLU ... Linear(h_last, classes).
std::unique_ptr<Model> make_mlp(std::int64_t in_features, std::span<const std::int64_t> hidden,
                                std::int64_t classes);

// The small Fashion-MNIST CNN, as the PyTorch nn.Sequential
//    0 Conv2d(in, 16, 3, padding=1)  1 BatchNorm2d(16)  2 ReLU  3 MaxPool2d(2)
//    4 Conv2d(16, 32, 3, padding=1)  5 BatchNorm2d(32)  6 ReLU  7 MaxPool2d(2)
//    8 Flatten  9 Linear(32.(H/4).(W/4), 128)  10 ReLU  11 Dropout(0.25)  12 Linear(128, classes)
// on (B, in.H.W) rows read as (B, in, H, W) images. H and W must be
// multiples of 4. For 1x28x28 and 10 classes: 207,018 parameters (200,832 of
// them in the Linear(1568, 128)), buffers 1.running_mean, 1.running_var,
// 1.num_batches_tracked and the same for 5 (98 floats); 2.54 MFLOP forward
// and 7.38 MFLOP forward + backward per sample (train_flops_per_sample).
// Training with Dropout needs a ForwardContext in Model::forward (Note
// [Keyed dropout] in dropout.cpp); evaluation needs set_training(false).
std::unique_ptr<Model> make_cnn(std::int64_t in_channels = 1, std::int64_t height = 28,
                                std::int64_t width = 28, std::int64_t classes = 10);

}  // namespace lockstep::nn
