#include "lockstep/nn/model.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "lockstep/error.h"

namespace lockstep::nn {

Model::Model(std::vector<std::unique_ptr<Layer>> layers) : layers_(std::move(layers)) {
  if (layers_.empty()) throw InvalidArgument("a model needs at least one layer");
  for (std::size_t i = 0; i < layers_.size(); ++i)
    if (!layers_[i]) throw InvalidArgument("layer " + std::to_string(i) + " of the model is null");
  for (std::size_t i = 1; i < layers_.size(); ++i) {
    if (layers_[i]->in_features() != layers_[i - 1]->out_features()) {
      throw InvalidArgument("layer " + std::to_string(i) + " (" + layers_[i]->describe() +
                            ") does not accept the output of " + layers_[i - 1]->describe());
    }
  }
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    for (auto& p : layers_[i]->params()) layout_.add(std::to_string(i) + "." + p.name, p.shape);
    for (auto& b : layers_[i]->buffers()) buffer_layout_.add(std::to_string(i) + "." + b.name, b.shape);
  }
  params_ = Arena(layout_.numel());
  grads_ = Arena(layout_.numel());
  buffers_ = Arena(buffer_layout_.numel());
  std::size_t t = 0;
  for (auto& layer : layers_) {
    layer_tensors_.push_back({t, t + layer->params().size()});
    std::vector<float*> p, g;
    for (std::size_t k = 0; k < layer->params().size(); ++k, ++t) {
      p.push_back(params_.view(layout_.tensors()[t]).data());
      g.push_back(grads_.view(layout_.tensors()[t]).data());
    }
    layer->bind(p, g);
  }
  std::size_t b = 0;
  for (auto& layer : layers_) {
    std::vector<float*> views;
    for (std::size_t k = 0; k < layer->buffers().size(); ++k, ++b)
      views.push_back(buffers_.view(buffer_layout_.tensors()[b]).data());
    layer->bind_buffers(views);
  }
  acts_.resize(layers_.size());
}

std::int64_t Model::in_features() const {
  return layers_.front()->in_features();
}
std::int64_t Model::out_features() const {
  return layers_.back()->out_features();
}

void Model::init(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto& layer : layers_) layer->init(rng);
}

void Model::set_training(bool training) {
  training_ = training;
  for (auto& layer : layers_) layer->set_training(training);
}

void Model::reserve(std::int64_t batch) {
  if (batch <= capacity_) return;
  capacity_ = batch;
  std::int64_t widest = in_features();
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    acts_[i].resize(static_cast<std::size_t>(batch * layers_[i]->out_features()));
    widest = std::max(widest, layers_[i]->out_features());
  }
  for (auto& d : dbuf_) d.resize(static_cast<std::size_t>(batch * widest));
}

std::span<const float> Model::forward(std::span<const float> x, std::int64_t batch,
                                      const std::function<void(std::size_t layer)>& layer_done,
                                      const ForwardContext& ctx) {
  LOCKSTEP_REQUIRE(batch >= 0 && x.size() == static_cast<std::size_t>(batch * in_features()),
                   "Model::forward: the input holds " + std::to_string(x.size()) + " floats, not batch " +
                       std::to_string(batch) + " x " + std::to_string(in_features()) + " features");
  LOCKSTEP_REQUIRE(ctx.sample_index.empty() || ctx.sample_index.size() == static_cast<std::size_t>(batch),
                   "Model::forward: the forward context needs one sample index per row, or none");
  reserve(std::max<std::int64_t>(batch, 1));
  input_ = x.data();
  forward_batch_ = batch;
  const float* in = input_;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->forward(in, acts_[i].data(), batch, ctx);
    if (layer_done) layer_done(i);
    in = acts_[i].data();
  }
  return {acts_.back().data(), static_cast<std::size_t>(batch * out_features())};
}

void Model::backward(std::span<const float> dlogits, std::int64_t batch, bool accumulate,
                     const std::function<void(std::size_t layer)>& layer_done) {
  LOCKSTEP_REQUIRE(batch == forward_batch_, "Model::backward: batch " + std::to_string(batch) +
                                                 ", but the last forward was of batch " +
                                                 std::to_string(forward_batch_) + " (backward needs its activations)");
  LOCKSTEP_REQUIRE(dlogits.size() == static_cast<std::size_t>(batch * out_features()),
                   "Model::backward: dlogits holds " + std::to_string(dlogits.size()) + " floats, not batch " +
                       std::to_string(batch) + " x " + std::to_string(out_features()) + " outputs");
  const float* dy = dlogits.data();
  for (std::size_t i = layers_.size(); i-- > 0;) {
    const float* x = i == 0 ? input_ : acts_[i - 1].data();
    float* dx = i == 0 ? nullptr : dbuf_[i % 2].data();
    layers_[i]->backward(x, acts_[i].data(), dy, dx, batch, accumulate);
    if (layer_done) layer_done(i);
    dy = dx;
  }
}

double Model::forward_flops_per_sample() const {
  double f = 0;
  for (auto& l : layers_) f += l->forward_flops(1);
  return f;
}

double Model::train_flops_per_sample() const {
  double f = forward_flops_per_sample();
  for (std::size_t i = 0; i < layers_.size(); ++i) f += layers_[i]->backward_flops(1, i != 0);
  return f;
}

std::string Model::describe() const {
  std::string s;
  for (std::size_t i = 0; i < layers_.size(); ++i) s += (i ? " -> " : "") + layers_[i]->describe();
  return s;
}

std::unique_ptr<Model> make_mlp(std::int64_t in_features, std::span<const std::int64_t> hidden,
                                std::int64_t classes) {
  if (in_features <= 0 || classes <= 0) throw InvalidArgument("an MLP needs positive in/out sizes");
  std::vector<std::unique_ptr<Layer>> layers;
  std::int64_t prev = in_features;
  for (auto h : hidden) {
    if (h <= 0) throw InvalidArgument("hidden layer widths must be positive, got " + std::to_string(h));
    layers.push_back(make_linear(prev, h));
    layers.push_back(make_relu(h));
    prev = h;
  }
  layers.push_back(make_linear(prev, classes));
  return std::make_unique<Model>(std::move(layers));
}

std::unique_ptr<Model> make_cnn(std::int64_t in_channels, std::int64_t height, std::int64_t width,
                                std::int64_t classes) {
  if (in_channels <= 0 || classes <= 0) throw InvalidArgument("a CNN needs positive channels and classes");
  if (height <= 0 || width <= 0 || height % 4 != 0 || width % 4 != 0)
    throw InvalidArgument("the CNN needs image sides that are positive multiples of 4, got " +
                          std::to_string(height) + "x" + std::to_string(width));
  constexpr std::int64_t kC1 = 16, kC2 = 32, kHidden = 128;
  constexpr float kDropout = 0.25f;
  const std::int64_t h2 = height / 2, w2 = width / 2, flat = kC2 * (height / 4) * (width / 4);
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(make_conv2d({.in_channels = in_channels,
                                .out_channels = kC1,
                                .height = height,
                                .width = width,
                                .kernel = 3,
                                .padding = 1}));
  layers.push_back(make_batch_norm2d({kC1, height, width}));
  layers.push_back(make_relu(kC1 * height * width));
  layers.push_back(make_max_pool2d({kC1, height, width}, 2));
  layers.push_back(make_conv2d(
      {.in_channels = kC1, .out_channels = kC2, .height = h2, .width = w2, .kernel = 3, .padding = 1}));
  layers.push_back(make_batch_norm2d({kC2, h2, w2}));
  layers.push_back(make_relu(kC2 * h2 * w2));
  layers.push_back(make_max_pool2d({kC2, h2, w2}, 2));
  layers.push_back(make_flatten(flat));
  layers.push_back(make_linear(flat, kHidden));
  layers.push_back(make_relu(kHidden));
  layers.push_back(make_dropout(kHidden, kDropout));
  layers.push_back(make_linear(kHidden, classes));
  return std::make_unique<Model>(std::move(layers));
}

}  // namespace lockstep::nn
