// A sequential model: layers in a chain, their parameters and gradients in
// two arenas, and the activations of the last forward pass.
//
// Parameter names follow PyTorch's nn.Sequential: "<layer index>.<param>",
// e.g. "0.weight", "0.bias", "2.weight" for Linear/ReLU/Linear, so a saved
// state loads directly into the equivalent PyTorch module.
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
  std::int64_t in_features() const;
  std::int64_t out_features() const;

  // Deterministic initialisation from `seed` (PyTorch's default schemes).
  void init(std::uint64_t seed);

  // x: (B, in) -> logits: (B, out). The span stays valid until the next call.
  // Keeps the activations that backward() needs; `x` itself must stay valid
  // until backward() returns.
  // `layer_done(i)`, if given, is called after each layer.
  std::span<const float> forward(std::span<const float> x, std::int64_t batch,
                                 const std::function<void(std::size_t layer)>& layer_done = {});
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
  std::vector<std::vector<float>> acts_;  // acts_[i] = output of layer i
  const float* input_ = nullptr;          // the last input batch (not owned)
  std::vector<float> dbuf_[2];            // ping-pong upstream gradients
  std::int64_t capacity_ = 0;
};

// Linear(in, h0) ReLU Linear(h0, h1) ReLU ... Linear(h_last, classes).
std::unique_ptr<Model> make_mlp(std::int64_t in_features, std::span<const std::int64_t> hidden,
                                std::int64_t classes);

}  // namespace lockstep::nn
