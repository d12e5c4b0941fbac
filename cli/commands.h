// The subcommands of the `lockstep` tool. Each registers its flags on the
// CLI11 app and returns the function to run once parsing succeeded.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace lockstep::cli {

using Action = std::function<int()>;

Action add_train_command(CLI::App& app);
Action add_bench_command(CLI::App& app);

}  // namespace lockstep::cli
