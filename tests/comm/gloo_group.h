// Test helper: runs the ranks of a Gloo process group as separate processes
// (the lockstep_gloo_rank program, gloo_rank_main.cpp), started with
// posix_spawn (the test process may have threads: never fork() it), each
// with stdout+stderr in DIR/rank<R>.log, under a wall-clock guard that kills
// every rank and fails the test instead of hanging CTest.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace lockstep::testing {

struct RankExit {
  int code = -1;    // exit status, or -1 if killed by a signal
  int signal = 0;   // the signal that killed it, or 0
  std::string log;  // what it wrote to stdout and stderr
  std::chrono::steady_clock::time_point ended;
};

class GlooGroup {
 public:
  explicit GlooGroup(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~GlooGroup() {
    for (auto& p : procs_)
      if (p.pid > 0 && !p.reaped) {
        ::kill(p.pid, SIGKILL);
        ::waitpid(p.pid, nullptr, 0);
      }
  }
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;

  // Starts one rank: lockstep_gloo_rank --rank R <args...>. Returns its index.
  int spawn(int rank, const std::vector<std::string>& args) {
    std::vector<std::string> argv_s = {LOCKSTEP_GLOO_RANK, "--rank", std::to_string(rank)};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    return spawn_program(argv_s,
                         "rank" + std::to_string(rank) + "_" + std::to_string(procs_.size()) + ".log");
  }

  // Starts any program (argv[0] a path); its output goes to DIR/<log_name>.
  int spawn_program(std::vector<std::string> argv_s, const std::string& log_name) {
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    const std::string log = (dir_ / log_name).string();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(rc, 0) << "posix_spawn " << argv[0];
    procs_.push_back({pid, log, false, {}});
    return static_cast<int>(procs_.size()) - 1;
  }

  // Starts ranks 0..n-1 with the same arguments.
  void spawn_all(int n, const std::vector<std::string>& args) {
    for (int r = 0; r < n; ++r) spawn(r, args);
  }

  void kill(int index) { ::kill(procs_.at(index).pid, SIGKILL); }

  // True once DIR/<name>.<rank> exists for every rank in `ranks`, polling until `guard`.
  bool wait_for_marks(const std::string& name, const std::vector<int>& ranks, std::chrono::seconds guard) {
    const auto give_up = std::chrono::steady_clock::now() + guard;
    for (;;) {
      bool all = true;
      for (int r : ranks) all = all && std::filesystem::exists(dir_ / (name + "." + std::to_string(r)));
      if (all) return true;
      if (std::chrono::steady_clock::now() > give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  void go() { std::ofstream(dir_ / "go") << "1"; }

  // Waits for every rank; after `guard` kills the rest and fails the test.
  std::vector<RankExit> wait_all(std::chrono::seconds guard) {
    const auto give_up = std::chrono::steady_clock::now() + guard;
    std::vector<RankExit> exits(procs_.size());
    for (;;) {
      bool all = true;
      for (std::size_t i = 0; i < procs_.size(); ++i) {
        auto& p = procs_[i];
        if (p.reaped) continue;
        int status = 0;
        if (::waitpid(p.pid, &status, WNOHANG) == p.pid) {
          p.reaped = true;
          p.ended = std::chrono::steady_clock::now();
          p.status = status;
        } else {
          all = false;
        }
      }
      if (all) break;
      if (std::chrono::steady_clock::now() > give_up) {
        ADD_FAILURE() << "ranks still running after the " << guard.count() << " s guard (hang); killed";
        for (auto& p : procs_)
          if (!p.reaped) ::kill(p.pid, SIGKILL);
        guard = std::chrono::seconds(3600);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (std::size_t i = 0; i < procs_.size(); ++i) {
      const auto& p = procs_[i];
      exits[i].code = WIFEXITED(p.status) ? WEXITSTATUS(p.status) : -1;
      exits[i].signal = WIFSIGNALED(p.status) ? WTERMSIG(p.status) : 0;
      std::ifstream in(p.log);
      std::stringstream s;
      s << in.rdbuf();
      exits[i].log = s.str();
      exits[i].ended = p.ended;
    }
    return exits;
  }

  const std::filesystem::path& dir() const { return dir_; }
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (const auto& p : procs_) out.push_back(p.pid);
    return out;
  }

 private:
  struct Proc {
    pid_t pid;
    std::string log;
    bool reaped;
    std::chrono::steady_clock::time_point ended;
    int status = 0;
  };
  std::filesystem::path dir_;
  std::vector<Proc> procs_;
};

}  // namespace lockstep::testing
