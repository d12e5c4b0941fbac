// The process-group factory: the one place that knows which optional
// backends were built. CMake (src/comm/CMakeLists.txt) links every backend
// target that exists into this file's target and sets LOCKSTEP_HAVE_GLOO and
// LOCKSTEP_HAVE_MPI to 1 or 0 accordingly; a backend that was not built is
// never referred to, so the build links without it.
#include "lockstep/comm/process_group.h"

#include <string>

#include "lockstep/error.h"

namespace lockstep::comm {
namespace {

constexpr bool kHaveGloo = LOCKSTEP_HAVE_GLOO;
constexpr bool kHaveMpi = LOCKSTEP_HAVE_MPI;

// Templates, so that the call in a discarded branch is never instantiated (and never linked).
template <bool kBuilt>
std::unique_ptr<Communicator> gloo_if_built(const ProcessGroupOptions& options) {
  if constexpr (kBuilt) {
    return connect_gloo(options);
  } else {
    throw InvalidArgument("this lockstep was built without Gloo (install libgloo-dev and rebuild)");
  }
}

template <bool kBuilt>
std::unique_ptr<Communicator> mpi_if_built(const ProcessGroupOptions& options) {
  if constexpr (kBuilt) {
    return connect_mpi(options);
  } else {
    throw InvalidArgument("this lockstep was built without MPI (install libopenmpi-dev and rebuild)");
  }
}

}  // namespace

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::Threads:
      return "threads";
    case Backend::Gloo:
      return "gloo";
    case Backend::Mpi:
      return "mpi";
  }
  return "?";
}

Backend backend_from_string(const std::string& name) {
  for (auto b : {Backend::Threads, Backend::Gloo, Backend::Mpi}) {
    if (name == to_string(b)) return b;
  }
  throw InvalidArgument("unknown backend '" + name + "'; the choices are threads, gloo, mpi");
}

bool backend_built(Backend backend) {
  switch (backend) {
    case Backend::Threads:
      return true;
    case Backend::Gloo:
      return kHaveGloo;
    case Backend::Mpi:
      return kHaveMpi;
  }
  return false;
}

std::unique_ptr<Communicator> connect(Backend backend, const ProcessGroupOptions& options) {
  switch (backend) {
    case Backend::Gloo:
      return gloo_if_built<kHaveGloo>(options);
    case Backend::Mpi:
      return mpi_if_built<kHaveMpi>(options);
    case Backend::Threads:
      break;
  }
  throw InvalidArgument(
      "connect() is for process backends (gloo, mpi); threads groups come from make_thread_group");
}

}  // namespace lockstep::comm
