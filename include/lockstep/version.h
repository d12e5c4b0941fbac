// The library's version, as the build was given it (CMake's PROJECT_VERSION).
#pragma once

namespace lockstep {

const char* version();  // e.g. "0.1.0"

}  // namespace lockstep
