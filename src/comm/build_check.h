// Private: the build a rank states to its peers (ProcessGroupOptions::build),
// checked alike by every process backend before it is sent.
#pragma once

#include <string>

#include "lockstep/comm/process_group.h"
#include "lockstep/error.h"

namespace lockstep::comm::detail {

// InvalidArgument unless `build` is 1 to kMaxBuildIdBytes printable bytes
// without spaces: a field of the Gloo claim (space-separated), and a C string
// beside the host name in MPI's exchange.
inline void check_build(const std::string& backend, const std::string& build) {
  constexpr std::size_t kMax = ProcessGroupOptions::kMaxBuildIdBytes;
  bool printable = !build.empty() && build.size() <= kMax;
  for (const char ch : build) printable = printable && ch > ' ' && ch < 0x7f;
  if (!printable) {
    throw InvalidArgument(backend + ": the build (ProcessGroupOptions::build) must be 1 to " +
                          std::to_string(kMax) + " printable characters without spaces, got '" +
                          build + "'");
  }
}

// The refusal of a peer `who` whose build is `theirs` (empty: it stated none,
// a build from before builds were compared) by `me`, whose build is `mine`.
inline std::string build_mismatch(const std::string& who, const std::string& theirs, const std::string& me,
                                  const std::string& mine) {
  return who + (theirs.empty() ? " runs an older lockstep, from before builds were compared," : " runs build " + theirs) +
         " but " + me + " runs build " + mine + "; start every rank from the same build (lockstep --version prints it)";
}

}  // namespace lockstep::comm::detail
