// Experiment (kept for its negative result; not built by CMake): would fusing the
// SGD step into the shared-memory all-reduce help 8 x 32 (issue 2)?
//
// Eight threads (the replicas) on this machine's two cores, each with its own
// weights, gradients and momentum of the default MLP's 669706 floats. Per step,
// each thread first adds into its own gradients (backward's last touch), then
//   mode 0 (what the trainer does): thread r sums chunk r of the eight
//     gradient buffers and writes the mean back into all eight; barrier; each
//     thread runs momentum SGD over its own arrays, zeroing its gradients.
//     Memory traffic 64 P floats per step (8 read + 8 written + 8 x 6).
//   mode 1 (fused): thread r sums chunk r block by block and, while the block's
//     mean is in registers/L1, updates that block of all eight replicas'
//     weights and momentum and zeroes their gradients. 48 P floats per step.
//   mode 2 (shared output): thread r writes chunk r's mean once, into one
//     shared buffer; barrier; each thread's SGD reads the mean from there (hot
//     in the caches: P floats for all eight) instead of its own gradients.
//     The all-reduce writes P floats instead of 8 P.
// Each replica still updates its own copy from its own state; only the thread
// that does the arithmetic changes.
//
//   g++ -O3 -march=native -std=c++20 -pthread -DBLOCK=2048 fused_optimizer.cpp -o fused
//   ./fused 0; ./fused 1; ./fused 2
//
// Measured 2026-12-04 (ms per step, three interleaved pairs, BLOCK 2048):
// separate 3.27, 3.06, 3.11; fused 3.50, 3.48, 3.56. An earlier draft (with a
// weight-decay term) gave the same order at BLOCK 512, 2048 and 8192. A quarter
// less traffic does not pay for touching 24 arrays in one pass instead of 6.
// docs/results.md lists this under what 8 x 32 tried.
//
// Measured 2026-12-05 (fifth session, a slower hour; three interleaved pairs):
// separate 5.47, 5.26, 4.93; shared output 5.60, 5.68, 4.67. No gain either,
// within the noise, so the trainer keeps the all-reduce's contract (every
// replica's gradients hold the mean).
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#ifndef BLOCK
#define BLOCK 2048
#endif

namespace {

constexpr int kReplicas = 8;
constexpr std::size_t kParams = 669706;
constexpr int kSteps = 400;

struct Replica {
  std::vector<float> w, g, m;
};

void sgd(float* w, float* g, float* m, const float* d_in, std::size_t n) {
  const float lr = 0.01f, mu = 0.9f;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = d_in[i];
    g[i] = 0;
    const float b = mu * m[i] + d;
    m[i] = b;
    w[i] -= lr * b;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  const bool fused = mode == 1, shared = mode == 2;
  std::vector<float> S(kParams);
  std::vector<Replica> reps(kReplicas);
  for (auto& r : reps) {
    r.w.assign(kParams, 0.5f);
    r.g.assign(kParams, 0.01f);
    r.m.assign(kParams, 0.0f);
  }
  std::barrier barrier(kReplicas);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::jthread> threads;
  for (int t = 0; t < kReplicas; ++t) {
    threads.emplace_back([&, t] {
      const std::size_t c0 = kParams * t / kReplicas, c1 = kParams * (t + 1) / kReplicas;
      std::vector<float> mean(BLOCK);
      for (int s = 0; s < kSteps; ++s) {
        for (auto& x : reps[t].g) x += 0.001f;
        barrier.arrive_and_wait();
        for (std::size_t b = c0; b < c1; b += BLOCK) {
          const std::size_t n = std::min<std::size_t>(c1 - b, BLOCK);
          for (std::size_t i = 0; i < n; ++i) {
            float a = 0;
            for (int k = 0; k < kReplicas; ++k) a += reps[k].g[b + i];
            mean[i] = a / kReplicas;
          }
          for (int k = 0; k < kReplicas; ++k) {
            if (shared) {
              if (k == 0) std::copy(mean.begin(), mean.begin() + n, S.begin() + b);
            } else if (fused) {
              sgd(reps[k].w.data() + b, reps[k].g.data() + b, reps[k].m.data() + b, mean.data(), n);
            } else {
              std::copy(mean.begin(), mean.begin() + n, reps[k].g.begin() + b);
            }
          }
        }
        if (!fused) {
          barrier.arrive_and_wait();
          auto& r = reps[t];
          sgd(r.w.data(), r.g.data(), r.m.data(), shared ? S.data() : r.g.data(), kParams);
        }
        barrier.arrive_and_wait();
      }
    });
  }
  threads.clear();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %.3f ms per step\n", mode == 2 ? "shared" : fused ? "fused" : "separate", s / kSteps * 1e3);
}
