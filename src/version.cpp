#include "lockstep/version.h"

namespace lockstep {

const char* version() { return LOCKSTEP_VERSION; }

}  // namespace lockstep
