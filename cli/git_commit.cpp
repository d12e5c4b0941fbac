// git_commit() (commands.h): the one file that includes the generated
// commit, so that a commit that changed no source recompiles this file alone
// (it stays out of the unity batches, which a source property would force
// on any file that has one).
#include "build_commit.h"  // generated: LOCKSTEP_COMMIT
#include "commands.h"

namespace lockstep::cli {

const char* git_commit() { return LOCKSTEP_COMMIT; }

}  // namespace lockstep::cli
