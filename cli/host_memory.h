// What this host has free, and the data sets the commands load within it.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "lockstep/data/dataset.h"

namespace lockstep::cli {

// The memory this process may still take: LOCKSTEP_MEMORY_AVAILABLE (bytes)
// if set, else the host's MemAvailable or, if less, what its cgroup's
// memory limit leaves (v2's memory.max, v1's memory.limit_in_bytes;
// cgroup.h), which may be 0 (a full cgroup); none if neither is known.
std::optional<double> available_memory_bytes();

// Bytes as the messages about memory show them: "24.1 GB", or "148 MB"
// under a gigabyte (a container's limit can be that small).
std::string show_bytes(double bytes);

// load_image_classification with the free memory as its budget, shared by
// `processes_here` processes that each load their own copy (the ranks of a
// group on this host): a data set that would not fit is refused, naming the
// file, instead of being ended part way by the kernel's OOM killer.
data::ImageClassificationData load_data(const std::filesystem::path& dir, bool normalize = false,
                                        int processes_here = 1);


}  // namespace lockstep::cli
