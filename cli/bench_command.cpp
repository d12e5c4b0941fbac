// `lockstep bench <what>`: benchmarks that print tables, or JSON with --json.
// They are programs, never timed tests (docs/results.md has their output).
#include "commands.h"

namespace lockstep::cli {

Action add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that print tables (and JSON with --json)");
  bench->require_subcommand(1);
  Action train = add_bench_train_command(*bench);
  Action allreduce = add_bench_allreduce_command(*bench);
  return [bench, train, allreduce] { return bench->got_subcommand("train") ? train() : allreduce(); };
}

}  // namespace lockstep::cli
