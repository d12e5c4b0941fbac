// What the host's control groups let this process use: the CPUs of its
// cpuset, a CPU quota, and a memory limit. A container's limits live here,
// not in /proc/cpuinfo or /proc/meminfo, so without them a job in a container
// sized for 2 CPUs and 4 GB on a 64-core, 512 GB host would count 64 cores
// and 512 GB. Both cgroup v2 (one hierarchy) and v1 (one per controller, as
// on this project's VM) are read.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace lockstep::cli {

struct CgroupLimits {
  // The effective cpuset of this process's cgroup (or of the nearest above
  // it that has one); empty when there is none.
  std::vector<int> cpus;
  // The smallest CPU quota / period of this cgroup and those above it, in
  // CPUs (1.5: one and a half CPUs' time per period); 0 when none is set.
  double cpu_quota = 0;
  // The least memory limit - usage of this cgroup and those above it, in
  // bytes, the usage without the inactive page cache (reclaimed first);
  // negative when none is set.
  double memory_free = -1;
};

// The limits of this process's cgroups, from `self` (a /proc/self/cgroup:
// "0::/path" for v2, "4:memory:/path" for v1) and their files under `mount`
// (v2's files in it, v1's in mount/<controller>), from each cgroup up to the
// mount. v2: cpuset.cpus.effective, cpu.max, memory.max - memory.current
// + memory.stat's inactive_file; v1: cpuset.effective_cpus,
// cpu.cfs_quota_us / cpu.cfs_period_us, memory.limit_in_bytes -
// memory.usage_in_bytes + memory.stat's total_inactive_file. A path that is
// not under the mount (a container without its own cgroup namespace, whose
// mount is its own cgroup; or "/../x", outside this namespace's root) reads
// the mount's own files.
CgroupLimits read_cgroup_limits(const std::filesystem::path& mount = "/sys/fs/cgroup",
                                const std::filesystem::path& self = "/proc/self/cgroup");

// A kernel CPU list such as "0-3,8" (cpuset.cpus.effective, Cpus_allowed_list);
// empty if it cannot be read.
std::vector<int> parse_cpu_list(const std::string& text);

// The cores a quota leaves of `cpus` CPUs: all of them without a quota, else
// the quota rounded up (1.5 CPUs' time keeps two cores busy part of the
// time), and at least 1.
int cores_within_quota(int cpus, double cpu_quota);

}  // namespace lockstep::cli
