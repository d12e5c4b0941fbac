// The library's version and the build's identity.
#pragma once

namespace lockstep {

const char* version();  // CMake's PROJECT_VERSION, e.g. "0.1.0"

// What ranks compare before they form a group (ProcessGroupOptions::build):
// the version and the sources it was built from, e.g. "0.1.0+g33a1d31c5d91"
// (a git commit), "0.1.0+g33a1d31c5d91.dirty.1f2e3d4c5b6a" (edited since),
// or "0.1.0+src.1f2e3d4c5b6a" (no git). Builds of the same sources agree
// whatever their compiler or build type.
const char* build_id();

}  // namespace lockstep
