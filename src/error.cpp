#include "lockstep/error.h"

#include <cstring>

namespace lockstep::detail {

void throw_check_failure(const char* file, int line, const char* cond, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(std::string(base ? base + 1 : file) + ":" + std::to_string(line) + ": check `" + cond +
              "` failed: " + msg);
}

}  // namespace lockstep::detail
