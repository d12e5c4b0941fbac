// Test helper: a model of the user's own, built from the public layers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/nn/layer.h"
#include "lockstep/nn/model.h"

namespace lockstep::testing {

// Neither built-in model: two hidden layers of different widths, batch norm
// over the 48 features read as 3x4x4 images (buffers) and dropout.
//   Linear(48, 48) BatchNorm2d(3) ReLU Linear(48, width) ReLU Dropout(0.1) Linear(width, classes)
inline std::unique_ptr<nn::Model> bn_mlp(std::int64_t features, std::int64_t classes,
                                         std::int64_t width = 24) {
  std::vector<std::unique_ptr<nn::Layer>> layers;
  layers.push_back(nn::make_linear(features, 48));
  layers.push_back(nn::make_batch_norm2d({.channels = 3, .height = 4, .width = 4}));
  layers.push_back(nn::make_relu(48));
  layers.push_back(nn::make_linear(48, width));
  layers.push_back(nn::make_relu(width));
  layers.push_back(nn::make_dropout(width, 0.1f));
  layers.push_back(nn::make_linear(width, classes));
  return std::make_unique<nn::Model>(std::move(layers));
}

}  // namespace lockstep::testing
