#include "lockstep/version.h"

#include "build_id.h"  // generated: cmake/build_id.cmake

namespace lockstep {

const char* version() { return LOCKSTEP_VERSION; }

const char* build_id() { return LOCKSTEP_BUILD_ID; }

}  // namespace lockstep
