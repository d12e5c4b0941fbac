// The library's version and the build's identity.
#pragma once

namespace lockstep {

const char* version();  // CMake's PROJECT_VERSION, e.g. "0.1.0"

// What ranks compare before they form a group (ProcessGroupOptions::build):
// the version and a hash of the library's and the command's sources, e.g.
// "0.1.0+1f2e3d4c5b6a". Builds of the same sources agree, whatever their git
// commit (one that changed only docs or tests), compiler or build type.
const char* build_id();


}  // namespace lockstep
