#include "peak_flops.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "cgroup.h"
#include "lockstep/nn/gemm.h"

namespace lockstep::cli {
namespace {

// The CPUs in this process's affinity mask (all of them if unknown).
int affinity_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return CPU_SETSIZE;
  return CPU_COUNT(&mask);
}

}  // namespace

HostCores host_cores() {
  const CgroupLimits limits = read_cgroup_limits();
  HostCores host;
  // The cgroup's effective cpuset (a container's hard limit, "0-3,8"), else
  // every online CPU. mpirun's binding is a narrower affinity mask inside
  // it, which a thread may widen.
  for (const int c : limits.cpus)
    if (c < CPU_SETSIZE) host.cpus.push_back(c);
  if (host.cpus.empty()) {
    for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()); ++c) host.cpus.push_back(int(c));
  }
  host.cores = cores_within_quota(static_cast<int>(host.cpus.size()), limits.cpu_quota);
  host.process = cores_within_quota(std::min(affinity_cpus(), static_cast<int>(host.cpus.size())), limits.cpu_quota);
  return host;
}

// Note [Measuring all cores from a bound process]: the MFU and the memcpy
// bandwidth are against the whole host. A thread inherits its creator's
// CPU mask, so in a process that mpirun bound to one core, every OpenBLAS
// and memcpy thread ran on that core and the "peak" was one core's (MFU
// measured 0.52 bound against 0.34 with --bind-to none, same host). Threads
// that set their own mask to one CPU each of the host measure the host.
int run_on_every_core(const HostCores& host, const std::function<void(int)>& body) {
  const int cores = host.cores;  // at most host.cpus.size()
  const bool pin = affinity_cpus() < cores;
  std::vector<std::thread> threads;
  for (int c = 0; c < cores; ++c) {
    threads.emplace_back([&, c] {
      if (pin) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(host.cpus[c], &one);
        pthread_setaffinity_np(pthread_self(), sizeof one, &one);  // best effort: a cpuset may refuse
      }
      body(c);
    });
  }
  for (auto& t : threads) t.join();
  return cores;
}

// 1536^3, four times: the same peak as 2048^3 to within 1-2% either way (the
// median of 15 alternated rounds, four runs; bench/experiments/peak_size.cpp),
// in 0.15 s instead of 0.37 s. 1024^3 read up to 4% low.
double measure_peak_sgemm_flops(const HostCores& host) {
  const std::int64_t n = 1536;
  const int previous = nn::blas_threads();
  const int cores = host.cores;
  double best = 0;
  if (affinity_cpus() >= cores) {
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
    nn::set_blas_threads(cores);
    for (int rep = 0; rep < 4; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      nn::sgemm(nn::Trans::No, nn::Trans::No, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, 2.0 * n * n * n / s);
    }
  } else {  // Note [Measuring all cores from a bound process]
    // One A and B, read by every thread; a C each.
    const std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f);
    std::vector<std::vector<float>> c(cores, std::vector<float>(n * n));
    nn::set_blas_threads(1);
    for (int rep = 0; rep < 4; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      run_on_every_core(host, [&](int i) {
        nn::sgemm(nn::Trans::No, nn::Trans::No, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c[i].data(), n);
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, 2.0 * n * n * n * cores / s);
    }
  }
  nn::set_blas_threads(previous);
  return best;
}

}  // namespace lockstep::cli
