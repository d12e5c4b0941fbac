#include "lockstep/error.h"

#include <cstring>

namespace lockstep {

void rethrow_first_cause(std::span<const std::exception_ptr> errors) {
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommAborted&) {
    } catch (...) {
      throw;
    }
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace lockstep

namespace lockstep::detail {

void throw_check_failure(const char* file, int line, const char* cond, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(std::string(base ? base + 1 : file) + ":" + std::to_string(line) + ": check `" + cond +
              "` failed: " + msg);
}

}  // namespace lockstep::detail
