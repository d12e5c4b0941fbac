// The supervisor's loop, in order:
//   1. signal handlers first (SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1 write their number to
//      a self-pipe), then fork+exec each child with all signals blocked
//      until its exec, its output on two pipes and PR_SET_PDEATHSIG set;
//   2. poll the children's pipes and the self-pipe (1 s at most per wait):
//      relay whole lines, reap children on SIGCHLD, forward SIGINT/SIGTERM/
//      SIGHUP/SIGUSR1 (a closed terminal or a dropped ssh session: the ranks get the
//      grace too, and the launcher removes its rendezvous directory);
//   3. on the first failure, SIGTERM (and SIGCONT) the rest (after a moment to end on their
//      own: SupervisorOptions::own_failure_wait); SIGKILL them after the grace;
//   4. once every child is reaped, read what is left in the pipes (2 s at
//      most: a grandchild may hold them open), restore the handlers, return.
//
// Why fork+exec and not posix_spawn: PR_SET_PDEATHSIG (no orphans if the
// launcher itself is killed) can only be set in the child. Between fork and
// exec the child calls only async-signal-safe functions, on data prepared
// before the fork, so the threads OpenBLAS may have started do not matter.
#include "process_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string_view>

#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Note [One static]: a signal handler can reach nothing but statics, so the
// self-pipe's write end is the one piece of global state; it is set only
// while supervise() runs.
int signal_pipe_write = -1;

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const auto n = write(signal_pipe_write, &byte, 1);
  errno = saved;
}

// 0, or the errno of the write that failed (our own output is gone: EPIPE,
// ENOSPC); the caller says so at the end.
int write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return 0;
}

// One child stream to one of our fds: whole lines, each behind the prefix.
class LineRelay {
 public:
  LineRelay(int from, int to, std::string prefix) : from_(from), to_(to), prefix_(std::move(prefix)) {}
  LineRelay(const LineRelay&) = delete;
  LineRelay& operator=(const LineRelay&) = delete;
  ~LineRelay() { close_now(); }

  int fd() const { return from_; }
  // The errno of the first relayed line that could not be written, or 0.
  int write_error() const { return write_error_; }
  bool open() const { return from_ >= 0; }

  // One read; at end of file, flushes a last unterminated line and closes.
  void on_readable() {
    char buf[65536];
    const ssize_t n = read(from_, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) return close_now();
    pending_.append(buf, static_cast<std::size_t>(n));
    std::size_t start = 0;
    for (std::size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
      emit(std::string_view(pending_).substr(start, nl - start));
    }
    pending_.erase(0, start);
    if (pending_.size() > kMaxLine) {  // no newline in sight: pass it on as a line of its own
      emit(pending_);
      pending_.clear();
    }
  }

  void close_now() {
    if (from_ < 0) return;
    if (!pending_.empty()) emit(pending_);
    pending_.clear();
    close(from_);
    from_ = -1;
  }

 private:
  static constexpr std::size_t kMaxLine = 1 << 20;
  void emit(std::string_view line) {  // one write: lines never mix
    std::string out;
    out.reserve(prefix_.size() + line.size() + 1);
    out.append(prefix_).append(line).push_back('\n');
    if (const int err = write_all(to_, out); err != 0 && write_error_ == 0) write_error_ = err;
  }
  int from_, to_;
  int write_error_ = 0;
  std::string prefix_;
  std::string pending_;  // the current line, not yet terminated
};

struct Pipe {
  int read = -1, write = -1;
};

// Both ends -1 if it failed (errno says why).
Pipe make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {};
  return {fds[0], fds[1]};
}

// Everything a child needs, prepared before the fork (no allocation after it).
struct Exec {
  std::vector<char*> argv, envp;
  explicit Exec(const ChildSpec& spec) {
    for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    argv.push_back(nullptr);
    envp.push_back(nullptr);
  }
};

[[noreturn]] void child_after_fork(const Exec& exec, pid_t parent, pid_t group, int devnull, Pipe out,
                                   Pipe err, const sigset_t& mask, bool ignore_hup) {
  // Async-signal-safe calls only from here on. Our handlers would write into
  // the supervisor's self-pipe: default actions before any signal is let in
  // (SIGHUP stays ignored under nohup, as the launcher's own is).
  for (int sig : {SIGPIPE, SIGCHLD, SIGINT, SIGTERM, SIGUSR1}) signal(sig, SIG_DFL);
  signal(SIGHUP, ignore_hup ? SIG_IGN : SIG_DFL);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);  // parent already gone
  setpgid(0, group);
  if (dup2(devnull, STDIN_FILENO) < 0 || dup2(out.write, STDOUT_FILENO) < 0 ||
      dup2(err.write, STDERR_FILENO) < 0)
    _exit(127);
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  execve(exec.argv[0], exec.argv.data(), exec.envp.data());
  static const char msg[] = "launch: exec failed\n";
  [[maybe_unused]] const auto n = write(STDERR_FILENO, msg, sizeof msg - 1);
  _exit(127);
}

struct Child {
  pid_t pid = -1;
  bool reaped = false;
  bool signalled = false;  // we sent it a signal
  int stopped_by = 0;      // the signal that stopped it (SIGSTOP, SIGTSTP), while it is stopped
  std::unique_ptr<LineRelay> out, err;
};

constexpr std::array<int, 5> kCaughtSignals{SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1};

}  // namespace

struct SupervisorSignals::Saved {
  std::array<struct sigaction, kCaughtSignals.size()> previous{};
  struct sigaction previous_pipe {};
};

SupervisorSignals::SupervisorSignals() : saved_(std::make_unique<Saved>()) {
  LOCKSTEP_REQUIRE(signal_pipe_write < 0, "SupervisorSignals: one at a time");
  const Pipe p = make_pipe();
  if (p.read < 0) throw IoError(std::string("launch: cannot create a pipe: ") + strerror(errno));
  read_ = p.read;
  fcntl(p.read, F_SETFL, O_NONBLOCK);
  fcntl(p.write, F_SETFL, O_NONBLOCK);
  signal_pipe_write = p.write;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  // Under nohup SIGHUP is ignored: it stays so, for the launcher and its
  // ranks, and the job outlives the terminal as the user asked.
  struct sigaction hup {};
  sigaction(SIGHUP, nullptr, &hup);
  hup_ignored_ = hup.sa_handler == SIG_IGN;
  for (std::size_t i = 0; i < kCaughtSignals.size(); ++i) {
    if (kCaughtSignals[i] == SIGHUP && hup_ignored_) {
      saved_->previous[i] = hup;
      continue;
    }
    sigaction(kCaughtSignals[i], &sa, &saved_->previous[i]);
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &saved_->previous_pipe);
}

SupervisorSignals::~SupervisorSignals() {
  for (std::size_t i = 0; i < kCaughtSignals.size(); ++i) sigaction(kCaughtSignals[i], &saved_->previous[i], nullptr);
  sigaction(SIGPIPE, &saved_->previous_pipe, nullptr);
  close(signal_pipe_write);
  signal_pipe_write = -1;
  close(read_);
}

std::string describe(const ChildExit& e) {
  if (!e.signaled) return "exit code " + std::to_string(e.value);
  const char* abbrev = sigabbrev_np(e.value);
  return "signal " + std::to_string(e.value) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
}

SupervisorResult supervise(const std::vector<ChildSpec>& specs, const SupervisorOptions& options) {
  SupervisorSignals signals;
  return supervise(specs, options, signals);
}

SupervisorResult supervise(const std::vector<ChildSpec>& specs, const SupervisorOptions& options,
                           SupervisorSignals& signals) {
  SupervisorResult result;
  {  // a signal caught before this call (between two runs of a job): no child is started
    unsigned char got[64];
    for (ssize_t n; result.forwarded_signal == 0 && (n = read(signals.fd(), got, sizeof got)) > 0;) {
      for (ssize_t k = 0; k < n && result.forwarded_signal == 0; ++k)
        if (got[k] != SIGCHLD) result.forwarded_signal = got[k];
    }
    if (result.forwarded_signal != 0) return result;
  }
  std::vector<Child> children(specs.size());
  // Stopping the job: SIGTERM to whoever is left at term_at, SIGKILL at kill_at.
  // A forwarded signal that the children stop on sets kill_at far off
  // (stop_timeout) without any SIGTERM; a rank that fails during that stop
  // still brings term_at and, with it, kill_at a grace after it (termed: the
  // SIGTERM step is done, or was the forwarded signal itself).
  std::optional<Clock::time_point> term_at, kill_at;
  bool termed = false, killed = false;

  const auto send_all = [&](int sig) {
    for (auto& c : children) {
      if (c.pid > 0 && !c.reaped) {
        kill(c.pid, sig);  // an unreaped child keeps its pid: never someone else's
        c.signalled = true;
      }
    }
  };
  const auto stop_by = [&](Clock::time_point t) {
    if (!term_at || t < *term_at) term_at = t;
  };
  const auto reap = [&] {
    for (std::size_t i = 0; i < children.size(); ++i) {
      auto& c = children[i];
      int status = 0;
      if (c.pid <= 0 || c.reaped || waitpid(c.pid, &status, WNOHANG | WUNTRACED | WCONTINUED) != c.pid) continue;
      if (WIFSTOPPED(status) || WIFCONTINUED(status)) {  // a rank stopped cannot answer: named if the job fails
        c.stopped_by = WIFSTOPPED(status) ? WSTOPSIG(status) : 0;
        continue;
      }
      c.reaped = true;
      ChildExit e{static_cast<int>(i), WIFSIGNALED(status),
                  WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), c.signalled};
      result.exits.push_back(e);
      // Killed by the signal we sent is our doing, not a failure of its own;
      // so is an exit with the shell's status for one it handled (lockstep
      // train stops at its next stop vote, writes its outputs and exits
      // 128 + the signal).
      const bool handled_ours = !e.signaled && e.after_stop &&
                                (e.value == 128 + SIGINT || e.value == 128 + SIGTERM || e.value == 128 + SIGHUP ||
                                 e.value == 128 + SIGUSR1);
      if (!e.failed() || (e.signaled && e.after_stop) || handled_ours) continue;
      const bool consequence = !e.signaled && e.value == options.consequence_exit_code;
      const bool first_was_consequence = result.first_failure && !result.first_failure->signaled &&
                                         result.first_failure->value == options.consequence_exit_code;
      if (!result.first_failure || (first_was_consequence && !consequence)) {
        result.first_failure = e;
        result.stopped.clear();  // the ranks stopped when it failed: the likely cause of a timeout
        for (std::size_t j = 0; j < children.size(); ++j)
          if (children[j].stopped_by != 0 && !children[j].reaped)
            result.stopped.push_back({static_cast<int>(j), false, children[j].stopped_by, false});
      }
      // A consequence means the group is aborted and its ranks are ending on
      // their own: the grace lets the one that failed finish saying why.
      stop_by(Clock::now() + (consequence ? options.grace : std::min(options.grace, options.own_failure_wait)));
    }
  };

  // 1. Start the children, all in the process group of the first.
  {
    const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) throw IoError(std::string("launch: cannot open /dev/null: ") + strerror(errno));
    sigset_t all, mask;
    sigfillset(&all);
    pid_t group = 0;
    std::string failure;
    for (std::size_t i = 0; i < specs.size() && failure.empty(); ++i) {
      const Exec exec(specs[i]);
      const Pipe out = make_pipe(), err = make_pipe();
      if (out.read < 0 || err.read < 0) {
        failure = std::string("launch: cannot create a pipe: ") + strerror(errno);
        for (int fd : {out.read, out.write, err.read, err.write})
          if (fd >= 0) close(fd);
        break;
      }
      const pid_t parent = getpid();
      sigprocmask(SIG_SETMASK, &all, &mask);  // no handler may run in the child before exec
      const pid_t pid = fork();
      if (pid == 0) child_after_fork(exec, parent, group, devnull, out, err, mask, signals.hup_ignored());
      const int fork_errno = errno;
      sigprocmask(SIG_SETMASK, &mask, nullptr);
      close(out.write);
      close(err.write);
      if (pid < 0) {
        close(out.read), close(err.read);
        failure = std::string("launch: cannot start a process: ") + strerror(fork_errno);
        break;
      }
      setpgid(pid, group);  // also here: whichever runs first, the child is in the group before we signal it
      if (group == 0) group = pid;
      children[i].pid = pid;
      children[i].out = std::make_unique<LineRelay>(
          out.read, STDOUT_FILENO, static_cast<int>(i) == options.plain_stdout ? "" : "[" + specs[i].label + "] ");
      children[i].err = std::make_unique<LineRelay>(err.read, STDERR_FILENO, "[" + specs[i].label + "] ");
      if (options.on_started) options.on_started(static_cast<int>(i), pid);
    }
    close(devnull);
    if (!failure.empty()) {
      send_all(SIGKILL);
      for (auto& c : children)
        if (c.pid > 0 && !c.reaped) waitpid(c.pid, nullptr, 0);  // SIGKILLed: returns at once
      throw IoError(failure);
    }
  }

  // 2-3. Relay, reap, forward, stop.
  std::optional<Clock::time_point> drain_until;
  for (;;) {
    const bool all_reaped =
        std::all_of(children.begin(), children.end(), [](const Child& c) { return c.reaped; });
    if (all_reaped && !drain_until) drain_until = Clock::now() + std::chrono::seconds(2);
    std::vector<pollfd> fds{{signals.fd(), POLLIN, 0}};
    std::vector<LineRelay*> relays;
    for (auto& c : children) {
      for (LineRelay* r : {c.out.get(), c.err.get()}) {
        if (r != nullptr && r->open()) {
          fds.push_back({r->fd(), POLLIN, 0});
          relays.push_back(r);
        }
      }
    }
    if (all_reaped && relays.empty()) break;
    const auto now = Clock::now();
    if (drain_until && now >= *drain_until) {
      // A grandchild may hold a pipe open for ever, so stop waiting; but what
      // the children wrote before they exited is in the pipes already (this
      // process may have been starved of CPU for the whole drain): take it,
      // up to 256 reads, against a grandchild that keeps writing.
      for (int reads = 0; reads < 256 && poll(fds.data(), fds.size(), 0) > 0; ++reads) {
        bool any = false;
        for (std::size_t k = 1; k < fds.size(); ++k) {
          if (fds[k].revents == 0 || !relays[k - 1]->open()) continue;
          relays[k - 1]->on_readable();
          any = true;
          if (!relays[k - 1]->open()) fds[k].fd = -1;  // poll ignores it now
        }
        if (!any) break;
      }
      break;
    }
    if (term_at && !termed && now >= *term_at) {
      send_all(SIGTERM);
      send_all(SIGCONT);  // a rank stopped (SIGSTOP) acts on the SIGTERM only once continued
      termed = true;
      if (!kill_at || now + options.grace < *kill_at) kill_at = now + options.grace;
    }
    if (kill_at && !killed && now >= *kill_at) {
      send_all(SIGKILL);
      killed = true;
    }
    auto wait = std::chrono::milliseconds(1000);
    for (const auto& deadline :
         {termed ? std::nullopt : term_at, killed ? std::nullopt : kill_at, drain_until}) {
      if (deadline) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - now);
        wait = std::clamp(left + std::chrono::milliseconds(1), std::chrono::milliseconds(0), wait);
      }
    }
    if (poll(fds.data(), fds.size(), static_cast<int>(wait.count())) < 0 && errno != EINTR) {
      throw IoError(std::string("launch: poll failed: ") + strerror(errno));
    }
    for (std::size_t k = 1; k < fds.size(); ++k)
      if (fds[k].revents != 0) relays[k - 1]->on_readable();
    if (fds[0].revents != 0) {
      unsigned char got[64];
      ssize_t n;
      while ((n = read(signals.fd(), got, sizeof got)) > 0) {
        for (ssize_t k = 0; k < n; ++k) {
          if (got[k] == SIGCHLD) continue;     // reaped below
          if (result.forwarded_signal != 0) {  // the second one: no more grace
            send_all(SIGKILL);
            killed = true;
            continue;
          }
          result.forwarded_signal = got[k];
          send_all(got[k]);
          if (options.children_stop_on_signal) {  // they end on their own, within stop_timeout
            if (!kill_at) kill_at = Clock::now() + std::max(options.grace, options.stop_timeout);
            continue;
          }
          termed = true;  // sent already: SIGKILL after the grace
          if (!kill_at || Clock::now() + options.grace < *kill_at) kill_at = Clock::now() + options.grace;
        }
      }
    }
    reap();  // also without SIGCHLD: cheap, and robust to a coalesced signal
  }
  // 4. Whatever a grandchild still holds open is cut off here; a line left
  // without its newline is passed on now, and output that could not be
  // passed on is reported.
  for (std::size_t i = 0; i < children.size(); ++i) {
    for (LineRelay* relay : {children[i].out.get(), children[i].err.get()}) {
      if (relay == nullptr) continue;
      relay->close_now();
      if (relay->write_error() != 0 && result.lost_output.empty()) {
        result.lost_output = std::string(relay == children[i].out.get() ? "standard output" : "standard error") +
                             " (" + std::strerror(relay->write_error()) + ")";
      }
    }
  }
  return result;
}

}  // namespace lockstep::cli
