// `lockstep launch --nproc N -- train ...`: N processes of this same binary on
// this host, one rank each, joined through a fresh file rendezvous.
//
// Each child gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE) plus LOCKSTEP_BACKEND, LOCKSTEP_RENDEZVOUS=file:DIR and
// LOCKSTEP_RENDEZVOUS_TIMEOUT, which the process-group flags take as their
// defaults, and LOCKSTEP_PREFIXED_STREAMS, the standard streams (1, 2) whose
// lines the launcher relays behind "[rank r] ", where outputs are refused. The rendezvous directory is created empty under $TMPDIR (or
// /tmp) and removed afterwards. Output, signals and failure propagation:
// process_supervisor.h. The launcher exits 0 when every rank did; else with
// the first failed rank's exit code (128 + signal if it was killed), and its
// last line on stderr names that rank and how it ended.
//
// Note [Restarting the job]
// With --max-restarts N, a failed job is started again, all ranks, up to N
// times, each time with a fresh rendezvous and LOCKSTEP_RESTART_COUNT = 1,
// 2, ... A synchronous job cannot go on without a rank (every step needs
// every replica's gradients), so the unit of recovery is the job, as in
// torchrun; train's --auto-resume makes the restarted job go on from its
// last checkpoint (Note [Restarts] in restarts.cpp). Not restarted: a
// job stopped by a signal to the launcher (the user's), and a rank that
// exited 2, a refused flag or setting, which every restart would meet again.
// The launcher catches signals across the runs (SupervisorSignals): one that
// comes between two runs, or as a run ends, starts no other.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "checks.h"
#include "commands.h"
#include "lockstep/error.h"
#include "process_supervisor.h"

extern char** environ;

namespace lockstep::cli {
namespace {

struct LaunchFlags {
  int nproc = 0;
  std::string backend = "gloo";
  double rendezvous_timeout_s = 60;
  double grace_s = 5;
  double stop_timeout_s = 300;
  int max_restarts = 0;
  std::vector<std::string> command;  // after "--": the subcommand and its flags
};

// The variables the launcher sets; the children never see an outer value of them.
const std::set<std::string> kOwnVariables = {"RANK",
                                             "WORLD_SIZE",
                                             "LOCAL_RANK",
                                             "LOCAL_WORLD_SIZE",
                                             "LOCKSTEP_BACKEND",
                                             "LOCKSTEP_RENDEZVOUS",
                                             "LOCKSTEP_RENDEZVOUS_TIMEOUT",
                                             "LOCKSTEP_PREFIXED_STREAMS",
                                             "LOCKSTEP_RESTART_COUNT"};

std::string self_executable() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw IoError("launch: cannot find this program's path (/proc/self/exe): " + ec.message());
  return path.string();
}

// A fresh, empty directory for the file rendezvous; removed when done.
// Named lockstep-launch-<host>-<pid>-XXXXXX: a launcher killed by SIGKILL
// cannot remove its own, so each launcher first removes those of this host
// whose launcher is gone and that this user owns. Gone: its pid no longer
// runs, and no one holds the flock the launcher keeps on its directory (a
// launcher in another pid namespace that shares /tmp and the host name
// looks dead by its pid alone). Other hosts' (a $TMPDIR shared over the
// network) are left alone.
class TempDir {
 public:
  TempDir() {
    const char* env = std::getenv("TMPDIR");
    const std::string base = env != nullptr && *env != '\0' ? env : "/tmp";
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    std::string name = host;
    for (char& ch : name)  // a file name's part: no separators
      if (ch == '/' || ch == '-') ch = '_';
    const std::string prefix = "lockstep-launch-" + name + "-";
    sweep(base, prefix);
    std::string tmpl = base + "/" + prefix + std::to_string(getpid()) + "-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      throw IoError("launch: cannot create a rendezvous directory under " + tmpl.substr(0, tmpl.rfind('/')) +
                    ": " + std::strerror(errno));
    }
    path_ = tmpl;
    lock_ = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // not inherited by the ranks
    if (lock_ >= 0) ::flock(lock_, LOCK_EX | LOCK_NB);
  }
  ~TempDir() {
    std::error_code ignored;  // destructors never throw
    std::filesystem::remove_all(path_, ignored);
    if (lock_ >= 0) ::close(lock_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  // Removes base/prefix<pid>-* directories of ours whose pid no longer runs.
  static void sweep(const std::string& base, const std::string& prefix) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(base, ec)) {
      const std::string file = entry.path().filename().string();
      if (file.rfind(prefix, 0) != 0) continue;
      const std::size_t dash = file.find('-', prefix.size());
      if (dash == std::string::npos || dash == prefix.size()) continue;
      const std::string digits = file.substr(prefix.size(), dash - prefix.size());
      if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      struct stat st {};
      if (lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) continue;
      const pid_t pid = static_cast<pid_t>(std::stol(digits));
      if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to tell
      const int fd = ::open(entry.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {  // its launcher no longer holds it
        std::error_code ignored;
        std::filesystem::remove_all(entry.path(), ignored);
      }
      ::close(fd);
    }
  }
  std::string path_;
  int lock_ = -1;
};

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

// One run of the job: N ranks on a fresh rendezvous, supervised to the end.
SupervisorResult run_job(const LaunchFlags& f, const std::string& exe, const std::vector<std::string>& inherited,
                         int restart, SupervisorSignals& signals) {
  const TempDir rendezvous;
  std::vector<ChildSpec> children;
  for (int r = 0; r < f.nproc; ++r) {
    ChildSpec c;
    c.label = "rank " + std::to_string(r);
    c.argv.push_back(exe);
    c.argv.insert(c.argv.end(), f.command.begin(), f.command.end());
    c.env = inherited;
    for (const auto& [name, value] : std::initializer_list<std::pair<const char*, std::string>>{
             {"RANK", std::to_string(r)},
             {"WORLD_SIZE", std::to_string(f.nproc)},
             {"LOCAL_RANK", std::to_string(r)},
             {"LOCAL_WORLD_SIZE", std::to_string(f.nproc)},
             {"LOCKSTEP_BACKEND", f.backend},
             {"LOCKSTEP_RENDEZVOUS", "file:" + rendezvous.path()},
             {"LOCKSTEP_RENDEZVOUS_TIMEOUT", seconds_text(f.rendezvous_timeout_s)},
             // The streams relayed with "[rank r] " before each line (supervise,
             // plain_stdout below): an output written there would not parse.
             {"LOCKSTEP_PREFIXED_STREAMS", r == 0 ? "2" : "1,2"},
             {"LOCKSTEP_RESTART_COUNT", std::to_string(restart)}}) {
      c.env.push_back(std::string(name) + "=" + value);
    }
    children.push_back(std::move(c));
  }

  std::vector<pid_t> pids;
  SupervisorOptions options;
  options.grace = std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(f.grace_s * 1000)));
  options.consequence_exit_code = kExitAbortedByPeer;
  options.plain_stdout = 0;  // rank 0 prints the results: as is, so that --json output parses
  // Every lockstep command a rank runs ends on a signal by itself: train at
  // its next stop vote with its outputs written (a SIGKILL after the
  // grace lost them), the others at once.
  options.children_stop_on_signal = true;
  options.stop_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(f.stop_timeout_s * 1000)));
  options.on_started = [&](int, pid_t pid) {
    pids.push_back(pid);
    if (static_cast<int>(pids.size()) != f.nproc) return;
    std::string line = "lockstep launch: " + std::to_string(f.nproc) + " processes (" + f.backend +
                       ", rendezvous file:" + rendezvous.path() + "), pids";
    for (pid_t p : pids) line += " " + std::to_string(p);
    std::fprintf(stderr, "%s\n", line.c_str());
  };
  return supervise(children, options, signals);
}

int run_launch(const LaunchFlags& f) {
  if (f.command.empty()) {
    throw InvalidArgument(
        "launch needs the command to run after --, e.g. lockstep launch --nproc 4 -- train");
  }
  if (f.command[0] == "launch") throw InvalidArgument("launch cannot launch itself; give e.g. -- train ...");
  // Only a command that joins the process group is one job across N
  // processes; anything else would run N independent copies (each printing,
  // each writing the same --save).
  const bool joins = f.command[0] == "train" || (f.command[0] == "bench" && f.command.size() > 1 &&
                                                  f.command[1] == "allreduce");
  const bool known = f.command[0] == "train" || f.command[0] == "bench" || f.command[0] == "demo" ||
                     f.command[0] == "plan";
  if (!known) {
    throw InvalidArgument("launch: '" + f.command[0] + "' is not a lockstep command; give train or bench allreduce " +
                          "after --, e.g. lockstep launch --nproc 4 -- train");
  }
  if (!joins) {
    const std::string what = f.command[0] + (f.command.size() > 1 && f.command[0] == "bench" ? " " + f.command[1] : "");
    throw InvalidArgument("launch runs commands that join a process group (train, bench allreduce); '" + what +
                          "' would run " + std::to_string(f.nproc) + (f.nproc == 1 ? " independent copy" : " independent copies") +
                          ". Run it without launch.");
  }
  for (std::size_t i = 1; i < f.command.size(); ++i) {
    const std::string& a = f.command[i];
    std::string backend;
    if (a == "--backend" && i + 1 < f.command.size()) backend = f.command[i + 1];
    if (a.rfind("--backend=", 0) == 0) backend = a.substr(10);
    if (!backend.empty() && backend != f.backend) {
      throw InvalidArgument("launch starts " + f.backend + " processes, but the command asks for --backend " +
                            backend + ", so the ranks would not join one job. Leave --backend out of the command.");
    }
    // What launch sets for each rank itself: given in the command too, every
    // rank would get the same value (one rank claimed N times, a group of
    // another size, a rendezvous other than the one launch made).
    for (const auto& [flag, how] : {std::pair<std::string, std::string>{"--rank", "each rank its own"},
                                    {"--world-size", "--nproc"},
                                    {"--rendezvous", "a fresh directory of its own"}}) {
      if (a == flag || a.rfind(flag + "=", 0) == 0) {
        throw InvalidArgument("launch sets " + flag + " for every rank (" + how + "); leave " + flag +
                              " out of the command" + (flag == "--world-size" ? " and give launch --nproc." : "."));
      }
    }
  }
  // A restarted train job goes on from its last checkpoint only with
  // --auto-resume (Note [Restarts]); without it each restart trains from
  // step 0, which may be meant, but is more often forgotten.
  if (f.max_restarts > 0 && f.command[0] == "train" &&
      std::find(f.command.begin(), f.command.end(), "--auto-resume") == f.command.end()) {
    std::fprintf(stderr,
                 "lockstep launch: warning: the command has no --auto-resume, so a restarted job trains again from "
                 "step 0; add --checkpoint FILE --auto-resume to go on from its last checkpoint.\n");
  }
  const std::string exe = self_executable();
  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    if (!kOwnVariables.contains(var.substr(0, var.find('=')))) inherited.push_back(var);
  }
  // Caught across the runs of the job: a signal between two of them stops it
  // too (Note [Restarting the job]).
  SupervisorSignals signals;
  for (int restart = 0;; ++restart) {  // Note [Restarting the job]
    const SupervisorResult result = run_job(f, exe, inherited, restart, signals);
    if (result.forwarded_signal != 0 && result.exits.empty()) {  // came before any rank started
      const std::string by = describe({.signaled = true, .value = result.forwarded_signal});
      if (restart == 0) {
        std::fprintf(stderr, "lockstep launch: interrupted by %s before the ranks started; none was started.\n",
                     by.c_str());
      } else {
        std::fprintf(stderr, "lockstep launch: interrupted by %s before restart %d of %d; the job was not "
                     "restarted.\n", by.c_str(), restart, f.max_restarts);
      }
      return 128 + result.forwarded_signal;
    }
    if (result.forwarded_signal != 0 && !result.first_failure) {
      std::fprintf(stderr, "lockstep launch: interrupted by %s; stopped all %d ranks.\n",
                   describe({.signaled = true, .value = result.forwarded_signal}).c_str(), f.nproc);
      return 128 + result.forwarded_signal;
    }
    if (!result.first_failure) {
      if (!result.lost_output.empty()) {  // the ranks succeeded, but what they printed did not arrive
        std::fprintf(stderr,
                     "lockstep launch: the ranks' output could not be passed on to %s, so it is incomplete; "
                     "write it where there is room.\n",
                     result.lost_output.c_str());
        return 1;
      }
      if (restart > 0) {
        std::fprintf(stderr, "lockstep launch: the job succeeded after %d restart%s.\n", restart,
                     restart == 1 ? "" : "s");
      }
      return 0;
    }
    const ChildExit& e = *result.first_failure;
    std::string stopped;  // a frozen rank makes the others time out, and the first of them "fails first"
    for (const ChildExit& s : result.stopped) {
      stopped += (stopped.empty() ? ", while rank " : " and rank ") + std::to_string(s.index) + " was stopped by " +
                 describe({.signaled = true, .value = s.value});
    }
    if (!stopped.empty()) stopped += " and could not answer";
    const bool refused = !e.signaled && e.value == kExitRefused;
    const bool again = restart < f.max_restarts && !refused && result.forwarded_signal == 0;
    std::string then = "; the other ranks were stopped";
    if (again) {
      then += ". Restarting the job (restart " + std::to_string(restart + 1) + " of " +
              std::to_string(f.max_restarts) + ")";
    } else if (refused && f.max_restarts > 0) {
      then += ". Not restarted: exit code 2 is a refused flag or setting, which a restart would meet again";
    } else if (result.forwarded_signal != 0 && restart < f.max_restarts) {
      then += ". Not restarted: interrupted by " + describe({.signaled = true, .value = result.forwarded_signal});
    } else if (restart > 0) {
      then += ", after " + std::to_string(restart) + " restart" + (restart == 1 ? "" : "s");
    }
    std::fprintf(stderr, "lockstep launch: rank %d failed first: %s%s%s%s.\n", e.index,
                 e.signaled ? "killed by " : "", describe(e).c_str(), stopped.c_str(), then.c_str());
    if (again) continue;
    return e.signaled ? 128 + e.value : e.value;
  }
}

}  // namespace

Action add_launch_command(CLI::App& app) {
  auto flags = std::make_shared<LaunchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "Run N local processes of a lockstep command as one job: lockstep launch --nproc 4 -- train ...");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--nproc", flags->nproc, "Processes (ranks) to start on this host")
      ->required()
      ->transform(whole_number_in(1, 1024))
      ->default_str("");  // required: no default to show
  cmd->add_option("--backend", flags->backend, "Process backend the ranks use")
      ->check(CLI::IsMember({"gloo"}));
  cmd->add_option("--rendezvous-timeout", flags->rendezvous_timeout_s,
                  "Seconds the ranks wait for each other to join")
      ->check(number_in(0.001, 1e6));
  cmd->add_option("--grace", flags->grace_s,
                  "Seconds between SIGTERM and SIGKILL when the job is stopped after a rank failed")
      ->check(number_in(0.0, 3600.0));
  cmd->add_option("--stop-timeout", flags->stop_timeout_s,
                  "Seconds the ranks get after a forwarded SIGINT/SIGTERM/SIGHUP/SIGUSR1 (train stops at its next stop vote, "
                  "about a second away, and writes its outputs) before SIGKILL; a second signal kills at once")
      ->check(number_in(0.0, 1e6));
  cmd->add_option("--max-restarts", flags->max_restarts,
                  "Start the whole job again, up to this many times, when a rank fails (not after a refused flag, "
                  "exit code 2, nor after a signal to the launcher); with train --checkpoint FILE --auto-resume it "
                  "goes on from the last checkpoint")
      ->transform(whole_number_in(0, 1000));
  cmd->add_option("command", flags->command, "The lockstep command each rank runs, after --");
  return [flags] { return run_launch(*flags); };
}

}  // namespace lockstep::cli
