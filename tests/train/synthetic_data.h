// Test helper: a small, learnable classification data set made in memory.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "lockstep/data/dataset.h"

namespace lockstep::testing {

// `train_size` samples of `features` floats in [0, 1); the label is the
// arg-max of a fixed random linear map, so a model can learn it.
inline data::ImageClassificationData synthetic_data(std::int64_t train_size, std::int64_t features = 48,
                                                    int classes = 10, std::int64_t test_size = 200) {
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> map(static_cast<std::size_t>(features * classes));
  for (auto& m : map) m = u(rng) - 0.5f;
  auto make = [&](std::int64_t n) {
    data::Dataset d;
    d.size = n;
    d.features = features;
    d.num_classes = classes;
    d.inputs.resize(static_cast<std::size_t>(n * features));
    for (auto& x : d.inputs) x = u(rng);
    for (std::int64_t i = 0; i < n; ++i) {
      int best = 0;
      float best_v = -1e30f;
      for (int c = 0; c < classes; ++c) {
        float v = 0;
        for (std::int64_t f = 0; f < features; ++f) v += d.inputs[i * features + f] * map[f * classes + c];
        if (v > best_v) best_v = v, best = c;
      }
      d.labels.push_back(best);
    }
    return d;
  };
  data::ImageClassificationData out;
  out.train = make(train_size);
  out.test = make(test_size);
  return out;
}

// Largest elementwise difference of two weight vectors of the same size.
inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace lockstep::testing
