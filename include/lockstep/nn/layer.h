// Layers: plain classes around plain math.
//
// A layer maps a batch x: (B, in_features) to y: (B, out_features), row-major.
// backward() takes the upstream gradient dy and
//   - writes (accumulate == false) or adds (accumulate == true) the gradients
//     of the layer's parameters into the storage given to bind();
//   - writes dx: (B, in_features) unless dx is null (the input needs no grad).
// Layers hold no activations: the Model keeps x and y for them.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace lockstep::nn {

struct ParamDecl {
  std::string name;  // relative to the layer, e.g. "weight"
  std::vector<std::int64_t> shape;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string describe() const = 0;  // e.g. "Linear(784, 512)"
  virtual std::int64_t in_features() const = 0;
  virtual std::int64_t out_features() const = 0;

  virtual std::vector<ParamDecl> params() const { return {}; }
  // One pointer per declared parameter, in declaration order.
  virtual void bind(std::span<float* const> params, std::span<float* const> grads) {}
  // Fills the bound parameters, drawing from `rng` in a fixed order.
  virtual void init(std::mt19937_64& rng) {}

  virtual void forward(const float* x, float* y, std::int64_t batch) = 0;
  virtual void backward(const float* x, const float* y, const float* dy, float* dx, std::int64_t batch,
                        bool accumulate) = 0;

  // Floating-point operations the math needs (2 per multiply-add).
  virtual double forward_flops(std::int64_t batch) const { return 0; }
  virtual double backward_flops(std::int64_t batch, bool need_dx) const { return 0; }
};

// y = x W^T + b with W: (out, in) and b: (out), PyTorch's nn.Linear layout.
// Init as PyTorch: W, b ~ U(-1/sqrt(in), 1/sqrt(in)).
std::unique_ptr<Layer> make_linear(std::int64_t in_features, std::int64_t out_features);

// y = max(x, 0).
std::unique_ptr<Layer> make_relu(std::int64_t features);

}  // namespace lockstep::nn
