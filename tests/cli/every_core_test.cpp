// run_on_every_core (cli/peak_flops.h): in a process bound to one CPU, as
// mpirun binds its ranks, the measuring threads still cover every CPU of the
// host (Note [Measuring all cores from a bound process]).
#include <gtest/gtest.h>
#include <sched.h>

#include <mutex>
#include <set>
#include <thread>

#include "peak_flops.h"

namespace lockstep::cli {
namespace {

TEST(EveryCore, ABoundProcessStillMeasuresEveryCpuOfTheHost) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  const HostCores host = host_cores();
  const int cores = host.cores;  // within a cgroup's quota, if any
  if (cores < 2 || CPU_COUNT(&allowed) < cores) GTEST_SKIP() << "fewer than 2 cores to spread over";
  int first = 0;
  while (!CPU_ISSET(first, &allowed)) ++first;
  // Bound as mpirun binds a rank, on a thread of our own so the test's
  // main thread keeps its mask; the measuring threads inherit this one.
  std::set<int> seen;
  std::mutex mu;
  std::thread bound([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    EXPECT_EQ(run_on_every_core(host, [&](int i) {
                cpu_set_t mine;
                CPU_ZERO(&mine);
                sched_getaffinity(0, sizeof mine, &mine);
                std::lock_guard lock(mu);
                EXPECT_EQ(CPU_COUNT(&mine), 1) << "thread " << i;
                for (int c = 0; c < CPU_SETSIZE; ++c)
                  if (CPU_ISSET(c, &mine)) seen.insert(c);
              }),
              cores);
  });
  bound.join();
  EXPECT_EQ(static_cast<int>(seen.size()), cores) << "the threads did not cover every CPU the process may use";
}

}  // namespace
}  // namespace lockstep::cli
