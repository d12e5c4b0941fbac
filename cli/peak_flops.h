#pragma once

#include <functional>
#include <vector>

namespace lockstep::cli {

// The cores of this host that this process could be given, read once.
struct HostCores {
  std::vector<int> cpus;  // its cgroup's cpuset (cgroup.h), else every online CPU
  int cores = 1;          // how many of them: no more than its cgroup's CPU quota rounded up
  int process = 1;        // and no more than this process's affinity mask (taskset, mpirun's binding)
};
HostCores host_cores();

// Peak sgemm FLOP/s of this machine on all cores (`host.cores`), measured
// now: the best of four 1536^3 OpenBLAS sgemm calls with one BLAS thread per
// core. Takes ~0.15 s on 2 cores.
// A process bound to fewer CPUs than that (mpirun binds each rank to a core
// by default) runs one single-threaded sgemm per core instead, on threads
// pinned to the host's CPUs (Note [Measuring all cores from a bound process]
// in peak_flops.cpp).
double measure_peak_sgemm_flops(const HostCores& host);

// Runs body(i) for i in [0, host.cores) on one thread each, all at once; when
// the process is bound to fewer CPUs, thread i is pinned to host.cpus[i].
// Returns host.cores.
int run_on_every_core(const HostCores& host, const std::function<void(int)>& body);

}  // namespace lockstep::cli
