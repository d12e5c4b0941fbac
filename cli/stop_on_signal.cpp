#include "stop_on_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <utility>

#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

// Process-wide because signal handlers are; lock-free, so async-signal-safe.
std::atomic<int> first_signal{0};
std::atomic<bool> announce_first{false};
std::atomic<bool> installed{false};
struct sigaction previous_int {}, previous_term {};

std::atomic<bool> on_terminal{false};  // end the progress line (\r-updated) first
constexpr char kMessage[] =
    "\nlockstep: interrupted; stopping at the next progress point (every --log-every steps, and at each epoch's "
    "end), with the outputs written. Interrupt again to quit at once.\n";

void ask_to_stop(int sig) {
  int none = 0;
  if (!first_signal.compare_exchange_strong(none, sig)) {  // the second: now
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
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
  announce_first = announce;
  on_terminal = ::isatty(STDERR_FILENO) == 1;
  struct sigaction action {};
  action.sa_handler = ask_to_stop;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (auto [sig, previous] : {std::pair{SIGINT, &previous_int}, std::pair{SIGTERM, &previous_term}}) {
    sigaction(sig, &action, previous);
    // A signal the process was started ignoring (a background job's SIGINT,
    // nohup) stays ignored, as the shell meant.
    if (previous->sa_handler == SIG_IGN) sigaction(sig, previous, nullptr);
  }
}

StopOnSignal::~StopOnSignal() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
  installed = false;
}

int StopOnSignal::signal() const { return first_signal.load(); }

}  // namespace lockstep::cli
