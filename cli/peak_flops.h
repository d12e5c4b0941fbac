#pragma once

#include <functional>

namespace lockstep::cli {

// Peak sgemm FLOP/s of this machine on all cores, measured now: the best of
// four 1536^3 OpenBLAS sgemm calls with one BLAS thread per core. Takes
// ~0.15 s on 2 cores.
// A process bound to fewer CPUs than the host has (mpirun binds each rank to
// a core by default) runs one single-threaded sgemm per CPU instead, on
// threads pinned to every CPU of the host (Note [Measuring all cores from a
// bound process] in peak_flops.cpp).
double measure_peak_sgemm_flops();

// The cores this process could be given: the CPUs of its cgroup's cpuset,
// else every online CPU, and no more than its cgroup's CPU quota rounded up
// (cgroup.h). The "all cores" of the peak and of the memcpy bandwidth.
int host_cores();

// The cores this process may run on now: host_cores(), and no more than the
// CPUs of its affinity mask (taskset, mpirun's binding).
int process_cores();

// Runs body(i) for i in [0, cores) on one thread each, all at once, where
// `cores` is host_cores(); when the process is bound to fewer CPUs, thread i
// is pinned to the i-th CPU of the cgroup's cpuset. Returns `cores`.
int run_on_every_core(const std::function<void(int)>& body);

}  // namespace lockstep::cli
