// `lockstep bench <what>`: benchmarks that print tables, or JSON with --json.
// They are programs, never timed tests (docs/results.md has their output).
#include "commands.h"

#include <algorithm>
#include <cstddef>

namespace lockstep::cli {

Action add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that print tables (and JSON with --json)");
  bench->require_subcommand(1);
  Action train = add_bench_train_command(*bench);
  Action allreduce = add_bench_allreduce_command(*bench);
  Action overlap = add_bench_overlap_command(*bench);
  return [bench, train, allreduce, overlap] {
    if (bench->got_subcommand("train")) return train();
    if (bench->got_subcommand("overlap")) return overlap();
    return allreduce();
  };
}


}  // namespace lockstep::cli
