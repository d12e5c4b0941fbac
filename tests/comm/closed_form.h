// Test helper: the collectives' inputs and their closed-form results, shared
// by the threads (allreduce_test.cpp, scatter_gather_test.cpp), Gloo
// (gloo_rank_main.cpp) and MPI (mpi_collectives_test.cpp) tests. Inputs are
// small integers, so every sum is exact in float and the expected value has a
// closed form. Each test keeps its own way of comparing (ASSERT/EXPECT, exact
// or within ulps).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "lockstep/comm/collectives.h"

namespace lockstep::testing::closed_form {

// --- all-reduce ---------------------------------------------------------------

// The element counts of the all-reduce grid at world size n.
inline std::vector<std::size_t> allreduce_counts(int n) {
  return {0, 1, std::size_t(n - 1), std::size_t(n), std::size_t(n + 1), 1000, std::size_t{1} << 20};
}

// Rank r's input element i.
inline float input(int r, std::size_t i) {
  return static_cast<float>((r + 1) * ((i % 7) + 1));
}

// Rank r's `count` inputs: input(r, 0), ..., input(r, count - 1).
inline std::vector<float> inputs(int r, std::size_t count) {
  std::vector<float> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = input(r, i);
  return data;
}

// Element i of the all-reduce of input() over n ranks.
inline float expected(comm::ReduceOp op, int n, std::size_t i) {
  const float base = static_cast<float>((i % 7) + 1);
  switch (op) {
    case comm::ReduceOp::Sum:
      return base * n * (n + 1) / 2.0f;
    case comm::ReduceOp::Mean:
      return base * n * (n + 1) / 2.0f / n;
    case comm::ReduceOp::Max:
      return base * n;
    case comm::ReduceOp::Min:
      return base;
  }
  return 0;
}

// gtest's FLOAT_EQ as a plain function: within 4 units in the last place, NaN
// equal to nothing (gtest's FloatingPoint::AlmostEquals, on the same biased
// integer representation). The grids compare millions of elements, and an
// ASSERT_FLOAT_EQ per element cost more than the collectives themselves under
// the sanitizers; they find the first mismatch with this and assert on that.
inline bool float_eq(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return false;
  auto biased = [](float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    return (u & 0x80000000u) != 0 ? ~u + 1 : u | 0x80000000u;
  };
  const std::uint32_t x = biased(a), y = biased(b);
  return (x > y ? x - y : y - x) <= 4;
}

// The first i where got[i] is not FLOAT_EQ to expected(op, n, i), or got.size().
inline std::size_t first_mismatch(const std::vector<float>& got, comm::ReduceOp op, int n) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!float_eq(got[i], expected(op, n, i))) return i;
  return got.size();
}

// --- reduce-scatter -----------------------------------------------------------

// The element counts of the reduce-scatter grid at world size n.
inline std::vector<std::size_t> reduce_scatter_counts(int n) {
  return {0, 1, std::size_t(n - 1), std::size_t(n), std::size_t(n + 1), 1000};
}

// Rank r's `count` reduce-scatter inputs: element i is (r + 1) (i % 5 + 1).
inline std::vector<float> reduce_scatter_inputs(int r, std::size_t count) {
  std::vector<float> in(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = float((r + 1) * (i % 5 + 1));
  return in;
}

// Rank r's chunk [begin, end) of `count` elements cut into n chunks.
inline std::size_t chunk_begin(std::size_t count, int n, int r) {
  return count * r / n;
}
inline std::size_t chunk_end(std::size_t count, int n, int r) {
  return count * (r + 1) / n;
}

// Element i (of the whole buffer) of the reduce-scatter of
// reduce_scatter_inputs() over n ranks; for Sum, Mean and Max.
inline float reduce_scatter_expected(comm::ReduceOp op, int n, std::size_t i) {
  const float base = float(i % 5 + 1);
  return op == comm::ReduceOp::Max   ? base * n
         : op == comm::ReduceOp::Sum ? base * n * (n + 1) / 2
                                     : base * (n + 1) / 2.0f;
}

// --- all-gather ---------------------------------------------------------------

// The block sizes (elements per rank) of the all-gather grid.
inline std::vector<std::size_t> all_gather_blocks() {
  return {0, 1, 7, 1000};
}

// Rank r's block of all-gather input, every element 10 r.
inline std::vector<float> all_gather_inputs(int r, std::size_t block) {
  return std::vector<float>(block, float(r * 10));
}

// Element i of the all-gather output: block i / block came from that rank.
inline float all_gather_expected(std::size_t block, std::size_t i) {
  return float((i / block) * 10);
}

// --- broadcast ----------------------------------------------------------------

// Rank r's broadcast buffer: 37 copies of r.
inline std::vector<float> broadcast_inputs(int r) {
  return std::vector<float>(37, static_cast<float>(r));
}

// Every rank's buffer after a broadcast from `root`.
inline std::vector<float> broadcast_expected(int root) {
  return std::vector<float>(37, float(root));
}

}  // namespace lockstep::testing::closed_form
