// The launcher's supervisor (cli/process_supervisor.h) with /bin/sh children:
// whole prefixed lines, stdout and stderr apart, failure propagation (SIGTERM,
// then SIGKILL after the grace), which failure is named first, and forwarded
// signals. Every case runs under a wall-clock guard (an alarm that kills the
// test process), so a hang fails instead of stalling CTest.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "process_supervisor.h"

extern char** environ;

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

ChildSpec sh(const std::string& label, const std::string& script) {
  return {label, {"/bin/sh", "-c", script}, environment()};
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh path one child creates when it is ready; wait_for(path) is the
// shell that waits for it (at most 30 s) before going on.
std::string marker(const std::string& name) {
  const fs::path p = fs::path(LOCKSTEP_TEST_TMPDIR) / "supervisor" / (name + ".ready");
  fs::create_directories(p.parent_path());
  fs::remove(p);
  return p.string();
}
std::string wait_for(const std::string& path) {
  return "i=0; while [ ! -e " + path + " ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; ";
}

struct Captured {
  SupervisorResult result;
  std::string out, err;
};

// Runs supervise() with this process's stdout and stderr sent to files.
Captured run(const std::vector<ChildSpec>& children, SupervisorOptions options = {}) {
  // Per process: CTest runs these tests in parallel, and two of them writing
  // the same files read each other's output (NUL bytes, lines of another test).
  const fs::path dir = fs::path(LOCKSTEP_TEST_TMPDIR) / ("supervisor_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::fflush(stdout);
  std::fflush(stderr);
  const int saved_out = dup(1), saved_err = dup(2);
  FILE* out = std::fopen((dir / "out").c_str(), "w");
  FILE* err = std::fopen((dir / "err").c_str(), "w");
  dup2(fileno(out), 1);
  dup2(fileno(err), 2);
  alarm(60);  // the wall-clock guard: SIGALRM ends the test process
  Captured c;
  try {
    c.result = supervise(children, options);
  } catch (...) {
    alarm(0);
    dup2(saved_out, 1), dup2(saved_err, 2);
    throw;
  }
  alarm(0);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out), close(saved_err);
  std::fclose(out);
  std::fclose(err);
  c.out = read_file(dir / "out");
  c.err = read_file(dir / "err");
  fs::remove_all(dir);
  return c;
}

TEST(Supervisor, RelaysWholePrefixedLinesWithStdoutAndStderrApart) {
  // A line written in three pieces, a last line without a newline, and both streams.
  const auto c = run({sh("rank 0", "printf 'ab'; sleep 0.05; printf 'c\\nd'; echo e >&2; printf tail"),
                      sh("rank 1", "echo one; echo two >&2")});
  EXPECT_TRUE(c.result.ok());
  EXPECT_EQ(c.result.exits.size(), 2u);
  EXPECT_NE(c.out.find("[rank 0] abc\n"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("[rank 0] dtail\n"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("[rank 1] one\n"), std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("two"), std::string::npos) << c.out;
  EXPECT_NE(c.err.find("[rank 0] e\n"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("[rank 1] two\n"), std::string::npos) << c.err;
  // Every line carries a prefix: nothing was cut or mixed.
  std::istringstream lines(c.out + c.err);
  for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("[rank ", 0), 0u) << line;
}

// launch relays rank 0's stdout (the results) as is, so that JSON parses;
// its stderr and the other ranks' output keep their prefix.
TEST(Supervisor, OneChildsStdoutCanBeRelayedWithoutThePrefix) {
  SupervisorOptions options;
  options.plain_stdout = 0;
  const auto c = run({sh("rank 0", "echo '{\"a\": 1}'; echo log >&2"), sh("rank 1", "echo one")}, options);
  EXPECT_TRUE(c.result.ok());
  EXPECT_NE(c.out.find("{\"a\": 1}\n"), std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("[rank 0]"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("[rank 1] one\n"), std::string::npos) << c.out;
  EXPECT_NE(c.err.find("[rank 0] log\n"), std::string::npos) << c.err;
}

TEST(Supervisor, ManyLinesFromManyChildrenNeverMix) {
  std::vector<ChildSpec> children;
  for (int r = 0; r < 4; ++r) {
    children.push_back(sh("rank " + std::to_string(r),
                          "i=0; while [ $i -lt 300 ]; do echo r" + std::to_string(r) +
                              "-line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done"));
  }
  const auto c = run(children);
  ASSERT_TRUE(c.result.ok());
  const std::regex whole(R"(\[rank (\d)\] r\1-line-\d+-x{40})");
  std::istringstream lines(c.out);
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count)
    EXPECT_TRUE(std::regex_match(line, whole)) << line;
  EXPECT_EQ(count, 4 * 300);
}

TEST(Supervisor, FirstFailureStopsTheOthers) {
  const auto c = run(
      {sh("rank 0", "exec sleep 30"), sh("rank 1", "echo dying >&2; exit 7"), sh("rank 2", "exec sleep 30")});
  ASSERT_TRUE(c.result.first_failure);
  EXPECT_EQ(c.result.first_failure->index, 1);
  EXPECT_FALSE(c.result.first_failure->signaled);
  EXPECT_EQ(c.result.first_failure->value, 7);
  EXPECT_EQ(describe(*c.result.first_failure), "exit code 7");
  ASSERT_EQ(c.result.exits.size(), 3u);
  for (const auto& e : c.result.exits) {
    if (e.index == 1) continue;
    EXPECT_TRUE(e.signaled && e.value == SIGTERM && e.after_stop) << describe(e);
  }
  EXPECT_NE(c.err.find("[rank 1] dying"), std::string::npos);
}

// A rank that fails on its own stops the group; the others learn of it and
// say so before they exit. They get a moment for that: SIGTERM at once cut
// rank 0's "communicator aborted" line off in 2 runs of 12.
TEST(Supervisor, TheOthersHaveAMomentToSayWhyTheyStop) {
  const std::string mark = marker("failed");
  const auto c = run({sh("rank 0", wait_for(mark) + "sleep 0.1; echo aborted too >&2; exit 3"),
                      sh("rank 1", "touch " + mark + "; exit 1")},
                     {.grace = std::chrono::seconds(20), .consequence_exit_code = 3});
  ASSERT_TRUE(c.result.first_failure);
  EXPECT_EQ(c.result.first_failure->index, 1);
  EXPECT_NE(c.err.find("[rank 0] aborted too"), std::string::npos) << c.err;
  for (const auto& e : c.result.exits) EXPECT_FALSE(e.signaled) << describe(e);
}

TEST(Supervisor, AChildThatIgnoresSigtermIsKilledAfterTheGrace) {
  const std::string mark = marker("ignoring");
  const auto c = run({sh("rank 0", "trap '' TERM; touch " + mark + "; while :; do sleep 0.05; done"),
                      sh("rank 1", wait_for(mark) + "kill -9 $$")},
                     {.grace = std::chrono::milliseconds(300)});
  ASSERT_TRUE(c.result.first_failure);
  EXPECT_EQ(c.result.first_failure->index, 1);
  EXPECT_EQ(describe(*c.result.first_failure), "signal 9 (SIGKILL)");
  ASSERT_EQ(c.result.exits.size(), 2u);
  EXPECT_EQ(c.result.exits[1].index, 0);
  EXPECT_TRUE(c.result.exits[1].signaled);
  EXPECT_EQ(c.result.exits[1].value, SIGKILL);
}

// A rank frozen by SIGSTOP when another fails is continued with the SIGTERM,
// so it ends then and not at the SIGKILL after the grace (a stopped process
// acts on SIGTERM only once continued); it is still named as stopped.
TEST(Supervisor, AStoppedChildEndsWithTheSigtermNotAfterTheGrace) {
  const std::string mark = marker("stopping");
  const auto c = run({sh("rank 0", "touch " + mark + "; kill -STOP $$; exec sleep 30"),
                      sh("rank 1", wait_for(mark) + "sleep 0.2; exit 1")},
                     {.grace = std::chrono::seconds(20), .own_failure_wait = std::chrono::milliseconds(100)});
  ASSERT_TRUE(c.result.first_failure);
  EXPECT_EQ(c.result.first_failure->index, 1);
  ASSERT_EQ(c.result.stopped.size(), 1u);
  EXPECT_EQ(c.result.stopped[0].index, 0);
  ASSERT_EQ(c.result.exits.size(), 2u);
  EXPECT_EQ(c.result.exits[1].index, 0);
  EXPECT_EQ(describe(c.result.exits[1]), "signal 15 (SIGTERM)") << "it was killed after the grace";
}

// A rank stopped by another's failure (exit code 3) is not named if the one
// that failed on its own ends after it; and it is not cut short: after a
// consequence the others get the grace to end on their own.
TEST(Supervisor, NamesTheCauseNotTheConsequence) {
  const auto c = run({sh("rank 0", "exit 3"), sh("rank 1", "sleep 0.3; echo why >&2; exit 1")},
                     {.grace = std::chrono::seconds(20), .consequence_exit_code = 3});
  ASSERT_TRUE(c.result.first_failure);
  EXPECT_EQ(c.result.first_failure->index, 1);
  EXPECT_EQ(c.result.first_failure->value, 1);
  EXPECT_FALSE(c.result.first_failure->after_stop);
  EXPECT_NE(c.err.find("[rank 1] why"), std::string::npos) << c.err;
  // With only consequences, the first of them is named.
  const auto d = run({sh("rank 0", "exit 3"), sh("rank 1", "exec sleep 30")},
                     {.grace = std::chrono::milliseconds(200), .consequence_exit_code = 3});
  ASSERT_TRUE(d.result.first_failure);
  EXPECT_EQ(d.result.first_failure->index, 0);
  ASSERT_EQ(d.result.exits.size(), 2u);
  EXPECT_EQ(describe(d.result.exits[1]), "signal 15 (SIGTERM)");
}

// Ctrl-C, and a closed terminal or dropped ssh session (SIGHUP, which
// killed the launcher at once and its ranks without the grace).
TEST(Supervisor, ForwardsSigintAndSighupToEveryChild) {
  for (int sig : {SIGINT, SIGHUP}) {
    std::atomic<bool> started{false};
    std::thread interrupt([&] {
      while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      kill(getpid(), sig);  // as a terminal's Ctrl-C, or its closing, would
    });
    const auto c = run({sh("rank 0", "exec sleep 30"), sh("rank 1", "exec sleep 30")},
                       {.on_started = [&](int index, pid_t) { started = started || index == 1; }});
    interrupt.join();
    EXPECT_EQ(c.result.forwarded_signal, sig);
    EXPECT_FALSE(c.result.first_failure);
    EXPECT_FALSE(c.result.ok());
    ASSERT_EQ(c.result.exits.size(), 2u);
    for (const auto& e : c.result.exits) EXPECT_TRUE(e.signaled && e.value == sig) << describe(e);
  }
}

// A thread that sends this process SIGINT, as a terminal's Ctrl-C would,
// once every child has created its marker (its trap is set; at most 30 s).
std::thread interrupt_when_ready(std::vector<std::string> markers) {
  return std::thread([markers = std::move(markers)] {
    const auto all_there = [&] {
      return std::all_of(markers.begin(), markers.end(), [](const std::string& m) { return fs::exists(m); });
    };
    for (int i = 0; i < 3000 && !all_there(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    kill(getpid(), SIGINT);
  });
}

// A child that handles the forwarded signal and exits with the shell's
// status for it (lockstep train: outputs written, then 128 + the signal) was
// stopped by the interrupt, not failing on its own: no rank "failed first".
// One that exits otherwise after it is still a failure.
TEST(Supervisor, AChildExitingWithTheStatusOfTheForwardedSignalIsNoFailure) {
  const std::string ready0 = marker("handled0"), ready1 = marker("handled1");
  std::thread interrupt = interrupt_when_ready({ready0, ready1});
  const auto c = run({sh("rank 0", "trap 'exit 130' INT; touch " + ready0 + "; while :; do sleep 0.05; done"),
                      sh("rank 1", "trap 'exit 7' INT; touch " + ready1 + "; while :; do sleep 0.05; done")});
  interrupt.join();
  EXPECT_EQ(c.result.forwarded_signal, SIGINT);
  ASSERT_TRUE(c.result.first_failure) << "rank 1 exited 7 after the interrupt: a failure of its own";
  EXPECT_EQ(c.result.first_failure->index, 1);
  EXPECT_EQ(c.result.first_failure->value, 7);
}

// Children that stop by themselves on a signal (lockstep train: at its next
// progress point, which may be far) are not SIGKILLed after the grace: that
// lost the outputs they were about to write. But not for ever: one that
// does not stop is killed after stop_timeout.
TEST(Supervisor, ChildrenThatStopOnASignalAreGivenTheTimeTheyTake) {
  const std::string ready = marker("slow_stop");
  std::thread interrupt = interrupt_when_ready({ready});
  // Longer than the grace after the signal, then the shell's status for it.
  const auto c = run({sh("rank 0", "trap 'sleep 1.5; exit 130' INT; touch " + ready + "; while :; do sleep 0.05; done")},
                     {.grace = std::chrono::milliseconds(300),
                      .children_stop_on_signal = true,
                      .stop_timeout = std::chrono::seconds(20)});
  interrupt.join();
  EXPECT_EQ(c.result.forwarded_signal, SIGINT);
  EXPECT_FALSE(c.result.first_failure);
  ASSERT_EQ(c.result.exits.size(), 1u);
  EXPECT_FALSE(c.result.exits[0].signaled) << describe(c.result.exits[0]) << ": killed after the grace";
  EXPECT_EQ(c.result.exits[0].value, 130);

  const std::string stuck = marker("stuck_stop");
  std::thread again = interrupt_when_ready({stuck});
  const auto k = run({sh("rank 0", "trap '' INT; touch " + stuck + "; while :; do sleep 0.05; done")},
                     {.grace = std::chrono::milliseconds(100),
                      .children_stop_on_signal = true,
                      .stop_timeout = std::chrono::milliseconds(500)});
  again.join();
  ASSERT_EQ(k.result.exits.size(), 1u);
  EXPECT_TRUE(k.result.exits[0].signaled && k.result.exits[0].value == SIGKILL) << describe(k.result.exits[0]);
}

// A rank that fails while the job stops on a forwarded signal ends the
// stop: the others get the failure's SIGTERM and SIGKILL, not the rest of
// stop_timeout. With a rank frozen (SIGSTOP, a hung peer) and the launcher
// sent SIGTERM or Ctrl-C, the other ranks' stop vote timed out and they
// exited 1 within --timeout; the launcher then waited the whole
// --stop-timeout (300 s) for the frozen rank before killing it. Here rank 0
// ignores the SIGINT, as a frozen rank does, but not a SIGTERM; rank 1 fails
// on the interrupt, as the ranks whose stop vote timed out. Before the fix
// rank 0 was SIGKILLed when stop_timeout ran out.
TEST(Supervisor, AFailureDuringAStopOnASignalStopsTheOthersAsAnyFailure) {
  const std::string deaf = marker("deaf_to_int"), failing = marker("fails_on_int");
  std::thread interrupt = interrupt_when_ready({deaf, failing});
  const auto c = run({sh("rank 0", "trap '' INT; touch " + deaf + "; while :; do sleep 0.05; done"),
                      sh("rank 1", "trap 'echo stop vote timed out >&2; exit 1' INT; touch " + failing +
                                       "; while :; do sleep 0.05; done")},
                     {.grace = std::chrono::seconds(20),
                      .own_failure_wait = std::chrono::milliseconds(100),
                      .children_stop_on_signal = true,
                      .stop_timeout = std::chrono::seconds(40)});
  interrupt.join();
  EXPECT_EQ(c.result.forwarded_signal, SIGINT);
  ASSERT_TRUE(c.result.first_failure);
  EXPECT_EQ(c.result.first_failure->index, 1);
  EXPECT_EQ(c.result.first_failure->value, 1);
  ASSERT_EQ(c.result.exits.size(), 2u);
  EXPECT_EQ(c.result.exits[1].index, 0);
  EXPECT_TRUE(c.result.exits[1].signaled && c.result.exits[1].value == SIGTERM)
      << describe(c.result.exits[1]) << ": the failure did not stop it; it waited for stop_timeout";
}

// Under nohup (SIGHUP ignored) the job outlives the terminal: the children
// inherit the ignored SIGHUP, and the supervisor leaves it ignored when it
// returns. Without nohup, the default action is back after supervise().
TEST(Supervisor, UnderNohupSighupStaysIgnored) {
  struct sigaction before {};
  sigaction(SIGHUP, nullptr, &before);
  signal(SIGHUP, SIG_IGN);
  const auto c = run({sh("rank 0", "kill -HUP $$; echo survived")});
  struct sigaction after {};
  sigaction(SIGHUP, nullptr, &after);
  sigaction(SIGHUP, &before, nullptr);
  EXPECT_TRUE(c.result.ok()) << c.err;
  EXPECT_NE(c.out.find("[rank 0] survived"), std::string::npos) << c.out << c.err;
  EXPECT_EQ(after.sa_handler, SIG_IGN);
  signal(SIGHUP, SIG_DFL);
  const auto d = run({sh("rank 0", "true")});
  sigaction(SIGHUP, nullptr, &after);
  sigaction(SIGHUP, &before, nullptr);
  EXPECT_EQ(after.sa_handler, SIG_DFL) << "the supervisor's handler was left installed";
}

TEST(Supervisor, AProgramThatCannotStartIsAFailure) {
  const auto c = run({{"rank 0", {"/nonexistent/program"}, environment()}});
  ASSERT_TRUE(c.result.first_failure);
  EXPECT_EQ(c.result.first_failure->value, 127);
  EXPECT_NE(c.err.find("[rank 0] launch: exec failed"), std::string::npos) << c.err;
}

}  // namespace
}  // namespace lockstep::cli
