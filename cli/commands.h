// The subcommands of the `lockstep` tool. Each registers its flags on the
// CLI11 app and returns the function to run once parsing succeeded.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lockstep::data {
struct ImageClassificationData;
}
namespace lockstep::train {
struct TrainConfig;
}

namespace lockstep::cli {

using Action = std::function<int()>;

// Exit code of a command stopped because another rank of its process group
// failed (CommAborted): `lockstep launch` names the rank that failed on its own.
inline constexpr int kExitAbortedByPeer = 3;

// Exit code of a refused flag, file or setting (a usage error, InvalidArgument):
// the same command would be refused again, so `lockstep launch --max-restarts`
// does not restart it.
inline constexpr int kExitRefused = 2;

// "512,512" -> {512, 512}; throws InvalidArgument naming the flag (train_command.cpp).
std::vector<std::int64_t> parse_hidden(const std::string& text);

// Refuses a run (InvalidArgument naming the flags to lower) whose
// `replicas_here` replicas' weights, gradients, optimizer state and
// activations are more than this host has free: the kernel's OOM killer
// would end it part way, without a word (train_memory.cpp). With
// `checkpoint_copy`, this process writes checkpoints and keeps a copy of one
// (Note [Checkpoints in the background]).
void check_memory(const train::TrainConfig& c, const data::ImageClassificationData& data, int replicas_here,
                  bool checkpoint_copy = false);

Action add_train_command(CLI::App& app);
Action add_bench_command(CLI::App& app);  // bench_command.cpp: the `bench` group
Action add_bench_train_command(CLI::App& bench);
Action add_bench_allreduce_command(CLI::App& bench);
Action add_bench_overlap_command(CLI::App& bench);
Action add_demo_command(CLI::App& app);  // demo_ragged.cpp
Action add_plan_command(CLI::App& app);  // plan_command.cpp
Action add_launch_command(CLI::App& app);  // launch_command.cpp

}  // namespace lockstep::cli
