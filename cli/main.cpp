// lockstep: synchronous data-parallel training, from the command line.
//
// main() is the one place that turns errors into a message and an exit code:
//   0 success, 1 a runtime error (file, data, replica failure), 2 a usage error,
//   3 stopped because another rank of a process group failed (kExitAbortedByPeer).
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "lockstep/error.h"

int main(int argc, char** argv) {
  CLI::App app{"lockstep: synchronous data-parallel training with N replicas in lockstep", "lockstep"};
  app.set_version_flag("--version", std::string("lockstep ") + LOCKSTEP_VERSION);
  app.require_subcommand(1);
  app.get_formatter()->column_width(34);
  lockstep::cli::Action train = lockstep::cli::add_train_command(app);
  lockstep::cli::Action bench = lockstep::cli::add_bench_command(app);
  lockstep::cli::Action demo = lockstep::cli::add_demo_command(app);
  lockstep::cli::Action plan = lockstep::cli::add_plan_command(app);
  lockstep::cli::Action launch = lockstep::cli::add_launch_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (app.got_subcommand("train")) return train();
    if (app.got_subcommand("demo")) return demo();
    if (app.got_subcommand("plan")) return plan();
    if (app.got_subcommand("launch")) return launch();
    return bench();
  } catch (const lockstep::InvalidArgument& e) {
    std::cerr << "lockstep: error: " << e.what() << "\n";
    return 2;
  } catch (const lockstep::CommAborted& e) {
    std::cerr << "lockstep: error: " << e.what() << "\n";
    return lockstep::cli::kExitAbortedByPeer;
  } catch (const std::bad_alloc&) {
    std::cerr << "lockstep: error: out of memory; lower --replicas, --micro-batch or --hidden.\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "lockstep: error: " << e.what() << "\n";
    return 1;
  }
}
