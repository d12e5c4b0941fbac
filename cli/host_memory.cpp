#include "host_memory.h"

#include <fstream>
#include <string>

namespace lockstep::cli {

double available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

data::ImageClassificationData load_data(const std::filesystem::path& dir, bool normalize) {
  return data::load_image_classification(dir,
                                         {.normalize = normalize, .memory_budget_bytes = available_memory_bytes()});
}

}  // namespace lockstep::cli
