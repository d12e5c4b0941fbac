#include "host_memory.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

namespace lockstep::cli {

double available_memory_bytes() {
  // An override, for a container whose limit /proc/meminfo does not show,
  // and for tests that must not depend on the machine's size.
  if (const char* env = std::getenv("LOCKSTEP_MEMORY_AVAILABLE"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    if (*end == '\0' && v > 0 && v < 1e18) return v;
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

data::ImageClassificationData load_data(const std::filesystem::path& dir, bool normalize, int processes_here) {
  return data::load_image_classification(
      dir, {.normalize = normalize,
            .memory_budget_bytes = available_memory_bytes() / std::max(1, processes_here)});
}

}  // namespace lockstep::cli
