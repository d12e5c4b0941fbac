// The git commit this build came from (cmake/build_id.cmake), for --version.
// Its own header, not commands.h: git_commit.cpp, recompiled whenever the
// commit changes, then compiles without CLI11 (7 s of compile).
#pragma once

namespace lockstep::cli {

// "33a1d314c579", "-dirty" after it if the sources were edited, or "unknown".
const char* git_commit();

}  // namespace lockstep::cli
