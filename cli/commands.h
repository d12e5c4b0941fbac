// The subcommands of the `lockstep` tool. Each registers its flags on the
// CLI11 app and returns the function to run once parsing succeeded.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace lockstep::cli {

using Action = std::function<int()>;

Action add_train_command(CLI::App& app);
Action add_bench_command(CLI::App& app);  // bench_command.cpp: the `bench` group
Action add_bench_train_command(CLI::App& bench);
Action add_bench_allreduce_command(CLI::App& bench);

}  // namespace lockstep::cli
