// Test helper: reproducible random inputs for the nn tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace lockstep::nn {

inline std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace lockstep::nn
