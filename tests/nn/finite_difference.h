// Test helper: central differences for the gradient checks of the nn tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

namespace lockstep::nn {

// sum_i y_i * r_i in double: the loss whose gradient with respect to y is r.
inline double dot(const std::vector<float>& y, const std::vector<float>& r) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += double(y[i]) * r[i];
  return s;
}

// Central difference of f with respect to v[i], restoring v[i].
template <class F>
double central(std::vector<float>& v, std::size_t i, float eps, F&& f) {
  const float saved = v[i];
  v[i] = saved + eps;
  const double up = f();
  v[i] = saved - eps;
  const double down = f();
  v[i] = saved;
  // Use the actually representable step, not the nominal one.
  return (up - down) / (double(saved + eps) - double(saved - eps));
}

inline void expect_close(double analytic, double numeric, double abs_tol, double rel_tol, const char* what,
                         std::size_t i) {
  EXPECT_NEAR(analytic, numeric, abs_tol + rel_tol * std::abs(numeric)) << what << "[" << i << "]";
}

}  // namespace lockstep::nn
