// ProcessGroupOptions from the environment (torchrun-style variables).
#include <cstdlib>
#include <string>

#include "lockstep/comm/process_group.h"
#include "lockstep/error.h"

namespace lockstep::comm {
namespace {

int int_from_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 20)) {
    throw InvalidArgument(std::string(name) + "='" + v + "' is not a non-negative integer");
  }
  return static_cast<int>(x);
}

std::string string_from_env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

ProcessGroupOptions with_environment(ProcessGroupOptions options) {
  if (options.rank < 0) options.rank = int_from_env("RANK");
  if (options.world_size < 0) options.world_size = int_from_env("WORLD_SIZE");
  if (options.rendezvous.empty()) options.rendezvous = string_from_env("LOCKSTEP_RENDEZVOUS");
  if (options.secret_file.empty()) options.secret_file = string_from_env("LOCKSTEP_SECRET_FILE");
  return options;
}

}  // namespace lockstep::comm
