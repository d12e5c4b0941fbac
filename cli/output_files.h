// The files a command writes (--save, --report, --svg, ...): checked before
// any work starts, and written so that nothing the user had is lost.
#pragma once

#include <string>
#include <vector>

#include "lockstep/atomic_file.h"  // write_file_atomically, for the outputs

namespace lockstep::cli {

struct NamedFile {
  std::string flag;  // "--report", or what the file is ("the training data")
  std::string path;  // empty: not given
  // For an input: the output flag that may replace it (--save over --init,
  // to go on from a checkpoint); empty: none may.
  std::string replaced_by = {};
};

// Throws InvalidArgument before a run if an output could not be written or
// would destroy something: a directory, a missing or read-only directory
// (a file is created and removed beside it, which also catches what access()
// lets root through, such as /proc), two outputs naming one file, or an
// output naming one of the run's inputs (the same file by any path: a
// symlink, a hard link, ./x and x).
void check_outputs(const std::vector<NamedFile>& outputs, const std::vector<NamedFile>& inputs);

// True if one of `outputs` is this process's standard output (/dev/stdout, or
// a path to the file or pipe it is): that output takes the stream, and the
// command's own text (a summary, a table) goes to standard error instead, so
// that `--report /dev/stdout | jq` gets the JSON alone.
bool takes_standard_output(const std::vector<NamedFile>& outputs);

}  // namespace lockstep::cli
