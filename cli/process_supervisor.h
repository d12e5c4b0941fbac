// Runs a few child processes as one job (`lockstep launch`): relays their
// output line by line under a label, forwards SIGINT/SIGTERM/SIGHUP/SIGUSR1 to them,
// and when one fails stops the rest.
//
// Contract:
// - Each child's stdout and stderr go to this process's stdout and stderr,
//   one whole line at a time, each line prefixed with the child's label
//   ("[rank 2] "). Lines of different children never mix within a line.
//   stdin is /dev/null.
// - The children form one process group (not the caller's), so a terminal's
//   Ctrl-C reaches only the supervisor, which forwards it. Each child gets
//   PR_SET_PDEATHSIG(SIGKILL): if the supervisor dies, so do they.
// - A child fails when it exits non-zero or is killed by a signal. On the
//   first failure every other child gets SIGTERM `own_failure_wait` later (at
//   most `grace`; they may end on their own first, saying why), and SIGKILL
//   `grace` after that if it is still there. When that failure is only a
//   consequence of another (`consequence_exit_code`), the SIGTERM waits
//   `grace`: the others are ending on their own, and the one that caused it
//   gets to say why.
//   SIGINT/SIGTERM/SIGHUP/SIGUSR1 to the supervisor are forwarded, SIGKILL follows
//   after `grace`; a second one sends SIGKILL at once. Under nohup (SIGHUP
//   ignored) SIGHUP stays ignored, by the supervisor and the children.
// - supervise() returns once every child has been reaped (no zombies, no
//   orphans). Every wait inside is bounded (poll with a timeout).
//
// Must be called from the process's main thread (the death signal is tied to
// the thread that forks). It installs handlers for SIGCHLD, SIGINT, SIGTERM,
// SIGUSR1, SIGHUP (unless ignored) and ignores SIGPIPE while it runs, and restores them
// before returning; or, given SupervisorSignals, leaves them to it, so that
// a signal between two calls (a job started again) is caught, not lost.
// Throws IoError if a pipe or process cannot be created (after stopping the
// children already started).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::cli {

struct ChildSpec {
  std::string label;              // e.g. "rank 2": the output prefix "[rank 2] "
  std::vector<std::string> argv;  // argv[0] is the program's path
  std::vector<std::string> env;   // "NAME=value", the child's whole environment
};

struct ChildExit {
  int index = -1;         // into the children given to supervise()
  bool signaled = false;  // killed by a signal (`value` is the signal), else exited (`value` is the code)
  int value = 0;
  bool after_stop = false;  // the supervisor had already sent it a signal
  bool failed() const { return signaled || value != 0; }
};
// "exit code 1", "signal 9 (SIGKILL)"
std::string describe(const ChildExit& e);

struct SupervisorOptions {
  std::chrono::milliseconds grace{5000};  // between SIGTERM and SIGKILL
  // An exit code that means "stopped because another child failed" (lockstep:
  // 3, CommAborted). Such a failure is named first only if no child failed
  // on its own; -1: none.
  int consequence_exit_code = -1;
  // After a child fails on its own, the others get this long (at most the
  // grace) to end by themselves before SIGTERM: lockstep ranks learn of the
  // abort within milliseconds and print what stopped them, which a SIGTERM
  // at once cut off. After a consequence they get the whole grace.
  std::chrono::milliseconds own_failure_wait{1000};
  // Called once per child as it starts (e.g. to print its pid).
  std::function<void(int index, pid_t pid)> on_started;
  // The child whose stdout is relayed as is, without the "[label] " prefix
  // (lockstep launch: rank 0, the only rank that prints results, so that
  // `launch ... --json > out.json` is JSON); -1: every line is prefixed.
  int plain_stdout = -1;
  // The children stop by themselves on SIGINT, SIGTERM, SIGHUP and SIGUSR1 (lockstep
  // train: at its next stop vote, its outputs written), which may take
  // longer than the grace: after a forwarded signal they get `stop_timeout`
  // before SIGKILL, and a second signal kills them at once. Otherwise SIGKILL
  // follows after the grace.
  bool children_stop_on_signal = false;
  std::chrono::milliseconds stop_timeout{300000};
};

struct SupervisorResult {
  std::vector<ChildExit> exits;            // in the order they were reaped
  std::optional<ChildExit> first_failure;  // the failure that stopped the job, if any
  int forwarded_signal = 0;                // the signal received and forwarded (SIGINT, ...), else 0
  std::vector<ChildExit> stopped;          // children stopped (SIGSTOP) when first_failure came; value: the signal
  std::string lost_output;                 // "standard output (No space left on device)": a relayed line was lost
  bool ok() const { return !first_failure && forwarded_signal == 0; }
};

// The handlers supervise() needs, for as long as this lives: SIGINT,
// SIGTERM, SIGHUP (unless ignored) and SIGUSR1 caught, SIGPIPE ignored. One
// at a time. `lockstep launch --max-restarts` holds one across the runs of a
// job: a signal that comes between two runs (or as one ends, after its last
// look) waits here, and the next supervise() starts no child but returns it
// as forwarded_signal, with no exits.
class SupervisorSignals {
 public:
  SupervisorSignals();
  ~SupervisorSignals();
  SupervisorSignals(const SupervisorSignals&) = delete;
  SupervisorSignals& operator=(const SupervisorSignals&) = delete;
  int fd() const { return read_; }  // the self-pipe: one byte per signal
  bool hup_ignored() const { return hup_ignored_; }

 private:
  int read_ = -1;
  bool hup_ignored_ = false;
  struct Saved;
  std::unique_ptr<Saved> saved_;  // the handlers to restore
};

SupervisorResult supervise(const std::vector<ChildSpec>& children, const SupervisorOptions& options);
SupervisorResult supervise(const std::vector<ChildSpec>& children, const SupervisorOptions& options,
                           SupervisorSignals& signals);

}  // namespace lockstep::cli
