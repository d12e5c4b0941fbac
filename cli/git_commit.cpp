// git_commit() (git_commit.h): the one file that includes the generated
// commit, so that a commit that changed no source recompiles this file alone
// (it stays out of the unity batches, which a source property would force
// on any file that has one).
#include "build_commit.h"  // generated: LOCKSTEP_COMMIT
#include "git_commit.h"

namespace lockstep::cli {

const char* git_commit() { return LOCKSTEP_COMMIT; }

}  // namespace lockstep::cli
