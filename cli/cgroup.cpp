#include "cgroup.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;

// The first line of a file, or "" if it cannot be read.
std::string first_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

// The value of `key` in a memory.stat ("inactive_file 123" lines), or 0.
double stat_value(const fs::path& file, const std::string& key) {
  std::ifstream in(file);
  std::string name;
  double value = 0;
  while (in >> name >> value)
    if (name == key) return value;
  return 0;
}

// A whole decimal number, or -1.
double whole_number(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::strtod(text.c_str(), nullptr);
}

// Calls read(dir) for the cgroup at `path` under `mount` and for each cgroup
// above it, up to `mount`. A path that is not there (a container without its
// own cgroup namespace sees its path from the host's root, with its own
// cgroup mounted as the root) reads `mount` alone.
template <typename Read>
void each_level(const fs::path& mount, const std::string& path, Read read) {
  std::vector<fs::path> levels;  // one name a level below the mount
  bool outside = false;          // "/../x": a cgroup outside this namespace's root
  for (const auto& name : fs::path(path).relative_path()) {
    if (name == "..") outside = true;
    if (!name.empty() && name != "." && name != "..") levels.push_back(name);
  }
  fs::path leaf = mount;
  for (const auto& name : levels) leaf /= name;
  std::error_code ec;
  if (outside || !fs::is_directory(leaf, ec)) levels.clear();
  for (std::size_t depth = levels.size() + 1; depth-- > 0;) {
    fs::path at = mount;
    for (std::size_t i = 0; i < depth; ++i) at /= levels[i];
    read(at);
  }
}

void add_cpus(CgroupLimits& l, const fs::path& file) {
  if (l.cpus.empty()) l.cpus = parse_cpu_list(first_line(file));
}

void add_quota(CgroupLimits& l, double quota, double period) {
  if (quota <= 0 || period <= 0) return;
  l.cpu_quota = l.cpu_quota > 0 ? std::min(l.cpu_quota, quota / period) : quota / period;
}

// A limit of 2^62 bytes or more is v1's "none" (a page-rounded LONG_MAX).
// `used` counts the page cache, of which the inactive files' part is
// reclaimed before the limit bites (MemAvailable counts it as free too).
void add_memory(CgroupLimits& l, double max, double used, double inactive_file) {
  if (max < 0 || max >= 0x1p62) return;
  const double free = std::max(0.0, max - std::max(0.0, used - inactive_file));
  l.memory_free = l.memory_free >= 0 ? std::min(l.memory_free, free) : free;
}

// A v1 controller's folder: mount/cpu, or mount/cpu,cpuacct where the
// controllers share a hierarchy and no link names them one by one.
fs::path controller_dir(const fs::path& mount, const std::string& controller, const std::string& list) {
  std::error_code ec;
  return fs::is_directory(mount / controller, ec) ? mount / controller : mount / list;
}

}  // namespace

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::istringstream ranges(text);
  std::string range;
  while (std::getline(ranges, range, ',')) {
    const auto dash = range.find('-');
    const double lo = whole_number(range.substr(0, dash));
    const double hi = dash == std::string::npos ? lo : whole_number(range.substr(dash + 1));
    if (lo < 0 || hi < lo || hi >= 1 << 16) return {};
    for (int c = int(lo); c <= int(hi); ++c) cpus.push_back(c);
  }
  return cpus;
}

CgroupLimits read_cgroup_limits(const fs::path& mount, const fs::path& self) {
  CgroupLimits l;
  std::ifstream in(self);
  std::string line;
  while (std::getline(in, line)) {  // "0::/path" (v2), "4:memory:/path" or "1:cpu,cpuacct:/path" (v1)
    const auto a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string list = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.rfind("0::", 0) == 0) {
      each_level(mount, path, [&](const fs::path& at) {
        add_cpus(l, at / "cpuset.cpus.effective");
        std::istringstream cpu_max(first_line(at / "cpu.max"));  // "max 100000" or "150000 100000"
        std::string quota, period;
        if (cpu_max >> quota >> period) add_quota(l, whole_number(quota), whole_number(period));
        add_memory(l, whole_number(first_line(at / "memory.max")), whole_number(first_line(at / "memory.current")),
                   stat_value(at / "memory.stat", "inactive_file"));
      });
      continue;
    }
    std::istringstream controllers(list);
    std::string controller;
    while (std::getline(controllers, controller, ',')) {
      const fs::path dir = controller_dir(mount, controller, list);
      if (controller == "cpuset") {
        each_level(dir, path, [&](const fs::path& at) { add_cpus(l, at / "cpuset.effective_cpus"); });
      } else if (controller == "cpu") {  // a quota of -1: none
        each_level(dir, path, [&](const fs::path& at) {
          add_quota(l, whole_number(first_line(at / "cpu.cfs_quota_us")), whole_number(first_line(at / "cpu.cfs_period_us")));
        });
      } else if (controller == "memory") {
        each_level(dir, path, [&](const fs::path& at) {
          add_memory(l, whole_number(first_line(at / "memory.limit_in_bytes")),
                     whole_number(first_line(at / "memory.usage_in_bytes")),
                     stat_value(at / "memory.stat", "total_inactive_file"));
        });
      }
    }
  }
  return l;
}

int cores_within_quota(int cpus, double cpu_quota) {
  if (cpu_quota <= 0) return std::max(1, cpus);
  return std::max(1, std::min(cpus, static_cast<int>(std::ceil(cpu_quota - 1e-9))));
}

}  // namespace lockstep::cli
