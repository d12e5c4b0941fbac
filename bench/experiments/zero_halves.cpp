// Experiment (not built by CMake): do the all-reduce's two halves, as --zero 1
// runs them, cost more than the all-reduce over a modelled link? (The plan
// prices them as its halves, and measured --zero 1 steps ran ~1.4 ms longer
// than replicated ones at 2 x 32 over 1 Gbit/s with one bucket;
// docs/cost-model.md, "ZeRO-1 (--zero 1)".)
//
// Two ranks of the threads backend behind a 1 Gbit/s, 50 us modelled link;
// the default MLP's 669706 floats; per iteration a ring all-reduce (mean),
// then reduce_scatter_in_place (mean) and all_gather_in_place; the median of
// 8 iterations per rank.
//
// Build and run from the build directory:
//   g++ -std=c++20 -O2 -I../include ../bench/experiments/zero_halves.cpp \
//     src/comm/liblockstep_comm.a src/liblockstep_core.a -lpthread -o /tmp/zero_halves && /tmp/zero_halves
//
// Measured 2026-12-06 (twice): all-reduce 22.01-22.06 ms, reduce-scatter
// 11.11-11.16 ms, all-gather 11.01-11.08 ms. The halves add up to the
// all-reduce within 0.2 ms, so the collectives are not what the step loses.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "lockstep/comm/collectives.h"
#include "lockstep/comm/modelled_link.h"
#include "lockstep/comm/threads.h"

using namespace lockstep::comm;
using Clock = std::chrono::steady_clock;

int main() {
  const int n = 2;
  const std::size_t count = 669706;
  auto comms =
      with_modelled_link(make_thread_group({.world_size = n}),
                         LinkModel{.bytes_per_second = 125e6, .latency = std::chrono::microseconds(50)});
  std::vector<double> whole(n), scatter(n), gather(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      std::vector<float> data(count, 1.0f);
      std::vector<double> a, b, c;
      const auto ms = [](Clock::time_point x, Clock::time_point y) {
        return std::chrono::duration<double, std::milli>(y - x).count();
      };
      for (int i = 0; i < 8; ++i) {
        const auto t0 = Clock::now();
        allreduce(*comms[r], data, {.op = ReduceOp::Mean, .algorithm = Algorithm::Ring});
        const auto t1 = Clock::now();
        reduce_scatter_in_place(*comms[r], data, {.op = ReduceOp::Mean});
        const auto t2 = Clock::now();
        all_gather_in_place(*comms[r], data);
        const auto t3 = Clock::now();
        a.push_back(ms(t0, t1));
        b.push_back(ms(t1, t2));
        c.push_back(ms(t2, t3));
      }
      for (auto* v : {&a, &b, &c}) std::sort(v->begin(), v->end());
      whole[r] = a[4];
      scatter[r] = b[4];
      gather[r] = c[4];
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r)
    std::printf("rank %d: all-reduce %.2f ms, reduce-scatter %.2f ms, all-gather %.2f ms\n", r, whole[r],
                scatter[r], gather[r]);
}
