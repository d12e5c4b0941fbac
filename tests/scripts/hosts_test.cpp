// scripts/hosts.sh: test hosts as network namespaces on shaped links. Checks
// that hosts reach each other, that the shaping bounds what TCP gets through
// a host's link in both directions (loose bounds on the kernel's shaper, not
// on our code's speed), that a failing host stops the run with its exit code,
// and that nothing is left behind: not after success, failure or SIGTERM, and
// after a SIGKILL not once `hosts.sh cleanup` has run.
//
// Needs root, ip, tc, bridges, veth and tbf (`hosts.sh check`); skips with the
// reason otherwise. Traffic stays between the test namespaces.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <iterator>
#include <thread>
#include <vector>

#include "temp_dir_test.h"

extern char** environ;

namespace {

const std::string kScript = std::string(LOCKSTEP_SOURCE_DIR) + "/scripts/hosts.sh";
const std::string kThroughput = std::string(LOCKSTEP_SOURCE_DIR) + "/scripts/tcp_throughput.py";

struct Result {
  int status = -1;  // exit code, or 128 + signal
  std::string output;
};

int exit_code(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

// Runs a shell command line to completion; stdout and stderr together.
Result run(const std::string& command) {
  Result result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) result.output.append(buf, n);
  result.status = exit_code(::pclose(pipe));
  return result;
}

std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The run's namespace prefix, from hosts.sh's "up:" line ("" if none).
std::string run_prefix(const std::string& output) {
  std::smatch m;
  static const std::regex up(R"(hosts: up: \d+ hosts (lockstep-hosts-\d+-)h0)");
  return std::regex_search(output, m, up) ? m[1].str() : "";
}

// The network namespaces whose names start with `prefix`.
std::string namespaces_with(const std::string& prefix) {
  std::istringstream list(run("ip netns list").output);
  std::string line, found;
  while (std::getline(list, line))
    if (line.rfind(prefix, 0) == 0) found += line + "\n";
  return found;
}

bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;
  auto close = text.rfind(')');
  return close != std::string::npos && text.size() > close + 2 && text[close + 2] == 'Z';
}

// Waits up to `limit` for `done()`; a bound, not a measurement.
template <typename F>
bool eventually(F done, std::chrono::seconds limit = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

class HostsTest : public lockstep::testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    Result check = run(kScript + " check");
    if (check.status != 0) GTEST_SKIP() << "cannot make test hosts here: " << check.output;
  }

  // Host 1 receives from every other host at once for 2 s; returns the
  // receiver's JSON line (aggregate bits per second into host 1).
  nlohmann::json measure_into_host1(int hosts, const std::string& rate) {
    std::string t = "python3 " + kThroughput;
    std::string per_host = "if [ $HOST = 1 ]; then " + t + " serve --bind $HOST_ADDR --connections " +
                           std::to_string(hosts - 1) + "; else " + t +
                           " send --to 10.77.0.2 --seconds 2 --sndbuf 32768; fi";
    Result r = run(kScript + " --hosts " + std::to_string(hosts) + " --rate " + rate +
                   " --timeout 60 -- bash -c " + shell_quoted(per_host));
    EXPECT_EQ(r.status, 0) << r.output;
    std::string prefix = run_prefix(r.output);
    EXPECT_NE(prefix, "") << r.output;
    EXPECT_EQ(namespaces_with(prefix), "") << "left behind after success";
    std::smatch m;
    static const std::regex line(R"(\[h1\] (\{.*\}))");
    if (!std::regex_search(r.output, m, line)) {
      ADD_FAILURE() << "no result from host 1:\n" << r.output;
      return {};
    }
    return nlohmann::json::parse(m[1].str());
  }

  // Starts hosts.sh in the background, each host writing its command's pid
  // to dir_/pid.I and then sleeping; returns once every host has written.
  pid_t start_sleeping_hosts(int hosts, std::vector<pid_t>& command_pids) {
    std::string per_host = "echo $$ > " + (dir_ / "pid.").string() + "$HOST; exec sleep 120";
    std::string line = "exec " + kScript + " --hosts " + std::to_string(hosts) +
                       " --timeout 120 -- bash -c " + shell_quoted(per_host) + " > " +
                       (dir_ / "out").string() + " 2>&1";
    const char* argv[] = {"/bin/bash", "-c", line.c_str(), nullptr};
    pid_t pid = -1;
    if (::posix_spawn(&pid, "/bin/bash", nullptr, nullptr, const_cast<char**>(argv), environ) != 0) return -1;
    for (int i = 0; i < hosts; ++i) {
      auto file = dir_ / ("pid." + std::to_string(i));
      bool written = eventually([&] {
        std::ifstream in(file);
        pid_t p = 0;
        if (!(in >> p)) return false;
        command_pids.push_back(p);
        return true;
      });
      EXPECT_TRUE(written) << "host " << i << " never started";
    }
    return pid;
  }

  std::string output_of_run() {
    std::ifstream in(dir_ / "out");
    return {std::istreambuf_iterator<char>(in), {}};
  }
};

TEST_F(HostsTest, OneFlowIsBoundedByTheRate) {
  auto got = measure_into_host1(2, "10mbit");
  ASSERT_TRUE(got.contains("bits_per_second"));
  double bps = got["bits_per_second"].get<double>();
  // TCP over MTU 1500 carries at most 95.6% of the frame rate; the 32 KiB
  // bucket adds 0.13 Mbit/s over 2 s. Unshaped, veth carries gigabits.
  EXPECT_LE(bps, 10e6 * 1.05);
  EXPECT_GE(bps, 10e6 * 0.25) << "hosts barely connected";
}

TEST_F(HostsTest, IngressIsShapedToo) {
  // Two senders, each allowed 10 Mbit/s out, into one host's 10 Mbit/s link:
  // without the switch port's shaper the receiver would get twice the rate.
  auto got = measure_into_host1(3, "10mbit");
  ASSERT_TRUE(got.contains("bits_per_second"));
  EXPECT_EQ(got["from"], nlohmann::json({"10.77.0.1", "10.77.0.3"}));
  double bps = got["bits_per_second"].get<double>();
  EXPECT_LE(bps, 10e6 * 1.05);
  EXPECT_GE(bps, 10e6 * 0.25) << "hosts barely connected";
}

TEST_F(HostsTest, FirstFailureStopsTheOthersAndIsTheExitCode) {
  Result r = run(kScript + " --hosts 3 --timeout 60 -- bash -c " +
                 shell_quoted("if [ $HOST = 2 ]; then exit 3; fi; exec sleep 120"));
  EXPECT_EQ(r.status, 3) << r.output;  // 124 would mean the others were not stopped
  EXPECT_NE(r.output.find("host 2 exited with 3 first"), std::string::npos) << r.output;
  std::string prefix = run_prefix(r.output);
  ASSERT_NE(prefix, "") << r.output;
  EXPECT_EQ(namespaces_with(prefix), "");
}

TEST_F(HostsTest, SigtermStopsEveryHostAndRemovesEverything) {
  std::vector<pid_t> commands;
  pid_t pid = start_sleeping_hosts(2, commands);
  ASSERT_GT(pid, 0);
  std::string prefix = run_prefix(output_of_run());
  ASSERT_NE(prefix, "") << output_of_run();
  EXPECT_NE(namespaces_with(prefix), "");
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(exit_code(status), 143) << output_of_run();
  EXPECT_EQ(namespaces_with(prefix), "");
  for (pid_t p : commands) EXPECT_TRUE(eventually([&] { return process_gone(p); })) << "pid " << p;
}

TEST_F(HostsTest, CleanupRemovesWhatAKilledRunLeft) {
  std::vector<pid_t> commands;
  pid_t pid = start_sleeping_hosts(2, commands);
  ASSERT_GT(pid, 0);
  std::string prefix = run_prefix(output_of_run());
  ASSERT_NE(prefix, "") << output_of_run();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_NE(namespaces_with(prefix), "") << "a killed run cannot clean up; this test needs leftovers";
  Result first = run(kScript + " cleanup");
  EXPECT_EQ(first.status, 0) << first.output;
  EXPECT_EQ(namespaces_with(prefix), "");
  for (pid_t p : commands) EXPECT_TRUE(eventually([&] { return process_gone(p); })) << "pid " << p;
  Result again = run(kScript + " cleanup");  // idempotent
  EXPECT_EQ(again.status, 0) << again.output;
}

}  // namespace
