#include "stop_on_signal.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <utility>

#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

// Process-wide because signal handlers are; lock-free, so async-signal-safe.
std::atomic<int> first_signal{0};
std::atomic<std::int64_t> first_at_ms{0};  // CLOCK_MONOTONIC
std::atomic<bool> announce_first{false};
std::atomic<bool> on_terminal{false};  // end the progress line (\r-updated) first
std::atomic<bool> installed{false};
// SIGUSR1 too: mpirun forwards it to its ranks and lets them end, where it
// kills them a moment after forwarding SIGINT or SIGTERM.
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
struct sigaction previous[std::size(kSignals)] = {};

// One signal can arrive twice: GNU timeout sends it to its child and then
// to its own process group, and a terminal's Ctrl-C reaches a whole group.
// Only a signal a second or more after the first is the user's second.
constexpr std::int64_t kSameSignalWithinMs = 1000;

constexpr char kMessage[] =
    "\nlockstep: interrupted; stopping at the replicas' next stop vote (about a second away, or after the step "
    "under way if steps take longer), with the outputs written. Interrupt again to quit at once.\n";

std::int64_t now_ms() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return std::int64_t(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
}

void ask_to_stop(int sig) {
  int none = 0;
  if (!first_signal.compare_exchange_strong(none, sig)) {
    if (now_ms() - first_at_ms.load() < kSameSignalWithinMs) return;  // the first, delivered again
    ::signal(sig, SIG_DFL);  // the second: now
    ::raise(sig);
    return;
  }
  first_at_ms = now_ms();
  if (announce_first.load()) {
    const int skip = on_terminal.load() ? 0 : 1;  // the newline
    const ssize_t ignored = ::write(STDERR_FILENO, kMessage + skip, sizeof kMessage - 1 - skip);
    (void)ignored;
  }
}

}  // namespace

StopOnSignal::StopOnSignal(bool announce) {
  if (installed.exchange(true)) throw Error("StopOnSignal: one exists already");
  first_signal = 0;
  first_at_ms = 0;
  announce_first = announce;
  on_terminal = ::isatty(STDERR_FILENO) == 1;
  struct sigaction action {};
  action.sa_handler = ask_to_stop;
  sigemptyset(&action.sa_mask);  // one handler at a time: another signal waits until this one has run
  for (int sig : kSignals) sigaddset(&action.sa_mask, sig);
  action.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < std::size(kSignals); ++i) {
    sigaction(kSignals[i], &action, &previous[i]);
    // A signal the process was started ignoring (a background job's SIGINT,
    // nohup's SIGHUP) stays ignored, as the shell meant.
    if (previous[i].sa_handler == SIG_IGN) sigaction(kSignals[i], &previous[i], nullptr);
  }
}

StopOnSignal::~StopOnSignal() {
  for (std::size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &previous[i], nullptr);
  installed = false;
}

int StopOnSignal::signal() const { return first_signal.load(); }

}  // namespace lockstep::cli
