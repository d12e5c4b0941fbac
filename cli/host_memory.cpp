#include "host_memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "cgroup.h"
#include "lockstep/error.h"

namespace lockstep::cli {

std::optional<double> available_memory_bytes() {
  // An override, for a limit neither /proc/meminfo nor the cgroup shows,
  // and for tests that must not depend on the machine's size.
  if (const char* env = std::getenv("LOCKSTEP_MEMORY_AVAILABLE"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    if (*end == '\0' && v >= 0 && v < 1e18) return v;  // 0: as a full container
    // Not silently ignored: "16G" fell back to the figure the override was
    // set to correct, and the memory checks ran against it.
    throw InvalidArgument(std::string("LOCKSTEP_MEMORY_AVAILABLE is '") + env +
                          "', not a number of bytes (from 0, such as 16e9); give the bytes this run may take, or "
                          "unset it.");
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::optional<double> available;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  // In a container, its cgroup's limit, which /proc/meminfo does not show.
  const double cgroup_free = read_cgroup_limits().memory_free;  // < 0: no limit found
  if (cgroup_free >= 0 && (!available || cgroup_free < *available)) return cgroup_free;
  return available;
}

std::string show_bytes(double bytes) {
  char text[32];
  if (bytes >= 1e9) {
    std::snprintf(text, sizeof text, "%.1f GB", bytes / 1e9);
  } else {
    std::snprintf(text, sizeof text, "%.0f MB", bytes / 1e6);
  }
  return text;
}

data::ImageClassificationData load_data(const std::filesystem::path& dir, bool normalize, int processes_here) {
  std::optional<double> budget = available_memory_bytes();
  if (budget) *budget /= std::max(1, processes_here);
  return data::load_image_classification(dir, {.normalize = normalize, .memory_budget_bytes = budget});
}

}  // namespace lockstep::cli
