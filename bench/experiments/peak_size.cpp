// Experiment (not built by CMake): how small can the sgemm that measures the
// peak for MFU be (cli/peak_flops.cpp) before it reads lower than 2048^3?
//
// MFU divides by the peak, so a peak measured 3% low reads as MFU 3% high. The
// measurement ran 4 x 2048^3 (0.37 s on this 2-core machine) at the start of
// every in-process run and at the end of every process group's, ~80 times in
// the CLI and launch tests, ~0.9 s each under the other test's load.
// This program alternates the candidate against the reference 15 times, as
// lockstep runs them (best of the repeats; OpenBLAS on all cores, or one
// single-threaded sgemm per core at once as in a bound process), and prints
// the medians and the median and range of the per-round ratios.
//
//   g++ -O2 -std=c++20 -pthread peak_size.cpp -o peak_size -lopenblas
//   ./peak_size
//
// Measured 2026-12-07 (OPENBLAS_CORETYPE=Haswell as on this VM). Median ratio
// candidate / reference per run, four runs (the first two from an earlier draft
// of this program with the same pairs):
//   all cores  1536 x 4: 1.006, 0.995, 1.002, 1.007   (0.15 s against 0.37 s)
//              1024 x 8: 0.966, 0.959, 1.018, 0.983   (0.10 s; low in two runs)
//              2048 x 2: 0.990, 0.998, 0.988, 0.986   (rounds from 0.92 to 1.05)
//   bound      1536 x 4 against 2048 x 3: 0.988, 0.998, 1.019, 1.009
// So 1536 x 4 reads the same peak, to within 1-2% either way, in 40% of the time.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace {

using Clock = std::chrono::steady_clock;

// Best GFLOP/s of `reps` n^3 products: OpenBLAS threaded over all cores, or
// (bound) one single-threaded product per core at once.
double peak(int n, int reps, bool bound, int cores) {
  const std::size_t nn = std::size_t(n) * n;
  std::vector<float> a(nn, 0.5f), b(nn, 0.25f);
  std::vector<std::vector<float>> c(cores, std::vector<float>(nn));
  const auto product = [&](int i) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                c[i].data(), n);
  };
  openblas_set_num_threads(bound ? 1 : cores);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    if (bound) {
      std::vector<std::thread> threads;
      for (int i = 0; i < cores; ++i) threads.emplace_back(product, i);
      for (auto& t : threads) t.join();
    } else {
      product(0);
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n * (bound ? cores : 1) / s);
  }
  return best / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void compare(const char* what, bool bound, int ref_reps, int n, int reps, int cores) {
  std::vector<double> ref, cand, ratio;
  for (int round = 0; round < 15; ++round) {
    ref.push_back(peak(2048, ref_reps, bound, cores));
    cand.push_back(peak(n, reps, bound, cores));
    ratio.push_back(cand.back() / ref.back());
  }
  std::printf("%-9s 2048 x %d: %6.1f GFLOP/s   %4d x %d: %6.1f   ratio %.3f [%.3f .. %.3f]\n", what, ref_reps,
              median(ref), n, reps, median(cand), median(ratio), *std::min_element(ratio.begin(), ratio.end()),
              *std::max_element(ratio.begin(), ratio.end()));
}

}  // namespace

int main() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  compare("all cores", false, 4, 1536, 4, cores);
  compare("all cores", false, 4, 1024, 8, cores);
  compare("all cores", false, 4, 2048, 2, cores);
  compare("bound", true, 3, 1536, 4, cores);
}
