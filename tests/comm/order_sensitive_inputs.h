// Test helper: inputs whose sums round differently in different orders
// (magnitudes spread over 2^-10..2^10), for the tests that hold an
// all-reduce to one summation order bit for bit (tree_allreduce_test.cpp,
// ring_segments_test.cpp). Rank r's values come from the seed + r.
#pragma once

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

namespace lockstep::testing {

inline std::vector<float> order_sensitive_inputs(unsigned seed, int rank, std::size_t count) {
  std::mt19937 gen(seed + static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (auto& x : v) x = d(gen) * std::ldexp(1.0f, int(gen() % 20) - 10);
  return v;
}

}  // namespace lockstep::testing
