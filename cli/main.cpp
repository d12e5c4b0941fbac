// lockstep: synchronous data-parallel training, from the command line.
//
// main() is the one place that turns errors into a message and an exit code:
//   0 success, 1 a runtime error (file, data, replica failure), 2 a usage error,
//   3 stopped because another rank of a process group failed (kExitAbortedByPeer).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "commands.h"
#include "git_commit.h"
#include "lockstep/error.h"
#include "lockstep/version.h"

namespace {

// A word where a command is expected that names none: CLI11 would only say
// "A subcommand is required". Returns the message, or "" if all is well.
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* group = &app;
  std::string path = "lockstep";
  for (int i = 1; i < argc && group != nullptr; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return "";
    // Nameless subcommands are option groups, not commands.
    const auto subs = group->get_subcommands([](CLI::App* sub) { return !sub->get_name().empty(); });
    if (subs.empty()) return "";
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* sub : subs) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      if (sub->get_name() == word) next = sub;
    }
    if (next == nullptr)
      return "unknown command '" + word + "' for " + path + "; the commands are " + names + " (" + path + " --help).";
    path += " " + word;
    group = next;
  }
  return "";
}

// One write per message: a rank of `lockstep launch` that is stopped right
// after would otherwise leave "lockstep: error: " without its reason (std::cerr
// is unbuffered and writes each piece on its own).
void print_error(const std::string& message) {
  const std::string line = "lockstep: error: " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

// CLI11's own message for a parse error (or --help, --version), written in
// one piece per stream like print_error's; returns its exit code.
int exit_with(const CLI::App& app, const CLI::Error& e) {
  std::ostringstream out, err;
  const int code = app.exit(e, out, err);
  std::fwrite(out.str().data(), 1, out.str().size(), stdout);
  std::fflush(stdout);
  std::fwrite(err.str().data(), 1, err.str().size(), stderr);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lockstep: synchronous data-parallel training with N replicas in lockstep", "lockstep"};
  // The build too: what ranks of one group must share (ProcessGroupOptions::build).
  // And the git commit (generated, like the build: cmake/build_id.cmake).
  app.set_version_flag("--version", std::string("lockstep ") + lockstep::version() + " (build " +
                                        lockstep::build_id() + ", commit " + lockstep::cli::git_commit() + ")");
  app.require_subcommand(1);
  app.get_formatter()->column_width(34);
  lockstep::cli::Action train = lockstep::cli::add_train_command(app);
  lockstep::cli::Action bench = lockstep::cli::add_bench_command(app);
  lockstep::cli::Action demo = lockstep::cli::add_demo_command(app);
  lockstep::cli::Action plan = lockstep::cli::add_plan_command(app);
  lockstep::cli::Action launch = lockstep::cli::add_launch_command(app);

  if (const std::string unknown = unknown_command(app, argc, argv); !unknown.empty()) {
    print_error(unknown);
    return lockstep::cli::kExitRefused;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11 says "--replicas: At Most 1 required but received 2" for a flag given twice.
    const std::string what = e.what();
    const auto colon = what.find(": At Most 1 required");
    if (colon == std::string::npos) return exit_with(app, e) == 0 ? 0 : lockstep::cli::kExitRefused;
    print_error(what.substr(0, colon) + " was given more than once; give it once.");
    return lockstep::cli::kExitRefused;
  } catch (const CLI::ParseError& e) {
    const int code = exit_with(app, e);
    const bool has_separator = std::any_of(argv, argv + argc, [](const char* a) { return std::strcmp(a, "--") == 0; });
    if (code != 0 && app.got_subcommand("launch") && !has_separator &&
        dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      // `lockstep launch --nproc 2 train --steps 2`: the command's own flags
      // reached launch's parser.
      std::fputs("lockstep: the command launch runs goes after --, e.g. lockstep launch --nproc 4 -- train "
                 "--steps 100\n",
                 stderr);
    }
    return code == 0 ? 0 : lockstep::cli::kExitRefused;
  }
  try {
    const int code = app.got_subcommand("train")    ? train()
                     : app.got_subcommand("demo")   ? demo()
                     : app.got_subcommand("plan")   ? plan()
                     : app.got_subcommand("launch") ? launch()
                                                    : bench();
    // What was printed (a summary, --json, a table) must have arrived: on a
    // full disk it was lost, and the exit code said success.
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      print_error(std::string("could not write to standard output (") + std::strerror(errno) +
                  "), so what this command printed is incomplete; write it where there is room.");
      return code == 0 ? 1 : code;
    }
    return code;
  } catch (const lockstep::InvalidArgument& e) {
    print_error(e.what());
    return lockstep::cli::kExitRefused;
  } catch (const lockstep::CommAborted& e) {
    print_error(e.what());
    // Stopped by another rank's failure: exit a moment after it, so that a
    // launcher that reports the first non-zero exit (mpirun) reports the
    // failure, not this consequence (1 of 3 mpirun runs named a stopped rank).
    // The group is gone by now (MPI finalised or left), so nothing waits on us.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    return lockstep::cli::kExitAbortedByPeer;
  } catch (const lockstep::TimeoutError& e) {
    // A collective's wait (the rendezvous's say what to do themselves): the
    // ranks it names were slow, or stopped, or gone.
    std::string what = e.what();
    const CLI::App* command = &app;  // the command that ran: bench allreduce, not bench
    while (!command->get_subcommands().empty()) command = command->get_subcommands().front();
    if (what.find("rendezvous") == std::string::npos && command->get_option_no_throw("--timeout") != nullptr) {
      what += ". If what it waited for was slow rather than stopped or gone, raise --timeout (seconds).";
    }
    print_error(what);
    return 1;
  } catch (const std::bad_alloc&) {
    print_error(std::string("out of memory; lower ") +
                (app.got_subcommand("bench") ? "--replicas, --sizes, --micro-batch or --hidden"
                                             : "--replicas, --micro-batch or --hidden") +
                ".");
    return 1;
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
}
