#include "peak_flops.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "lockstep/nn/gemm.h"

namespace lockstep::cli {

double measure_peak_sgemm_flops() {
  const std::int64_t n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const int previous = nn::blas_threads();
  nn::set_blas_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    nn::sgemm(nn::Trans::No, nn::Trans::No, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s);
  }
  nn::set_blas_threads(previous);
  return best;
}

}  // namespace lockstep::cli
