// The shared process-group flags (process_group_flags.h).
#include "process_group_flags.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string_view>
#include <thread>

#include "checks.h"
#include "lockstep/error.h"
#include "lockstep/train/trainer.h"

namespace lockstep::cli {
namespace {

comm::Duration seconds(double s) { return comm::Duration(static_cast<std::int64_t>(std::ceil(s * 1000))); }

// Note [MPI's start-up has no timeout]: MPI_Init waits for every process of
// the job (Open MPI's start-up exchange), and no MPI call bounds it. mpirun
// starts the ranks together, but each loads its data first, so a rank that
// is stopped, hung or slow before it reaches MPI_Init held every other rank
// in it for ever. The library may not end the process; the command may. So a
// process of the CLI that connects over MPI arms this watchdog: if the
// connect has not returned after --rendezvous-timeout plus the two --timeout
// waits that follow MPI_Init in it (connect_mpi's own duplicate of the world
// communicator and its exchange of host names, which fail by themselves),
// it says why and _exits 1, and mpirun ends the job.
class ConnectWatchdog {
 public:
  ConnectWatchdog(std::chrono::duration<double> limit, std::string message)
      : thread_([this, limit, message = std::move(message)] {
          std::unique_lock lock(mu_);
          if (cv_.wait_for(lock, limit, [&] { return done_; })) return;
          // One write: the line is not cut by another thread's output.
          [[maybe_unused]] const auto n = ::write(STDERR_FILENO, message.data(), message.size());
          ::_exit(1);
        }) {}
  ConnectWatchdog(const ConnectWatchdog&) = delete;
  ConnectWatchdog& operator=(const ConnectWatchdog&) = delete;
  ~ConnectWatchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

std::string mpirun_rank_text() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* env = std::getenv(name); env != nullptr && *env != '\0') return std::string("rank ") + env + ": ";
  }
  return "";
}

}  // namespace

void add_process_group_flags(CLI::App& cmd, ProcessGroupFlags& f, bool with_timeout) {
  // Defaults from the environment, torchrun-style (`lockstep launch` sets
  // both). Checked when used: a bad value is an error then, not here.
  if (const char* b = std::getenv("LOCKSTEP_BACKEND"); b != nullptr && *b != '\0') f.backend = b;
  if (const char* t = std::getenv("LOCKSTEP_RENDEZVOUS_TIMEOUT"); t != nullptr && *t != '\0') {
    char* end = nullptr;
    const double v = std::strtod(t, &end);
    f.rendezvous_timeout_s = *end == '\0' && v > 0 && v <= 1e6 ? v : std::nan("");
  }
  cmd.add_option("--backend", f.backend,
                 "threads: every replica a thread of this process; gloo or mpi: this process is one rank of a "
                 "group of processes")
      ->check(CLI::IsMember({"threads", "gloo", "mpi"}));
  cmd.add_option("--rank", f.rank, "This process's rank (gloo; default: $RANK)")
      ->transform(whole_number_in(0, 1 << 20))
      ->default_str("");  // unset: -1 is no rank, so the help shows none
  cmd.add_option("--world-size", f.world_size, "Number of ranks (gloo; default: $WORLD_SIZE)")
      ->transform(whole_number_in(1, 1 << 20))
      ->default_str("");
  cmd.add_option("--rendezvous", f.rendezvous,
                 "Where the ranks meet: file:DIR (one host or a shared filesystem) or redis://HOST:PORT (gloo; "
                 "default: $LOCKSTEP_RENDEZVOUS)")
      ->check(not_empty());
  cmd.add_option("--bind", f.bind,
                 "Address this rank listens on (gloo; default: loopback for a file rendezvous, else the interface "
                 "that routes to the rendezvous host; not a wildcard such as 0.0.0.0, which peers cannot connect to)")
      ->check(not_empty());
  cmd.add_option("--job-id", f.job_id, "Keeps jobs that share a rendezvous apart")->check(not_empty());
  cmd.add_option("--secret-file", f.secret_file,
                 "A file readable only by its owner; every rank proves it knows it to every peer (gloo; default: "
                 "$LOCKSTEP_SECRET_FILE)")
      // Not empty: --secret-file "" (an unset $VAR) read as no flag, and the
      // job ran open to anyone, without the warning a Redis rendezvous gets.
      ->check(not_empty());
  cmd.add_option("--rendezvous-timeout", f.rendezvous_timeout_s,
                 "Seconds to wait for every rank to join (gloo: the rendezvous; mpi: MPI's start-up, which waits "
                 "for every process of the job)")
      ->check(number_in(0.001, 1e6));
  if (with_timeout) {
    cmd.add_option("--timeout", f.timeout_s, "Seconds any collective may wait before the group is aborted")
        ->check(number_in(0.001, 1e6));
  }
  cmd.add_option("--per-node", f.per_node,
                 "In-process replicas per node (--backend threads), as if on replicas/G machines: what "
                 "--algorithm hierarchical needs (processes find their nodes from host names)")
      ->transform(whole_number_in(1, 1024))
      ->default_str("");
}

void check_nodes(const ProcessGroupFlags& f, int replicas, comm::Algorithm algorithm,
                 std::optional<bool> modelled_link) {
  const bool threads = backend_of(f) == comm::Backend::Threads;
  if (f.per_node > 0 && !threads) {
    throw InvalidArgument("--per-node groups in-process replicas (--backend threads); a " + f.backend +
                          " group finds its nodes from the ranks' host names.");
  }
  if (f.per_node > 0 && replicas % f.per_node != 0) {
    throw InvalidArgument("--per-node " + std::to_string(f.per_node) + " does not divide the " +
                          std::to_string(replicas) + " replicas into equal nodes.");
  }
  // Only the hierarchical all-reduce reads the nodes: auto picks it for large
  // buffers over a modelled link, and in-process without one the shared-memory path.
  if (threads && f.per_node > 0 && algorithm != comm::Algorithm::Hierarchical &&
      !(algorithm == comm::Algorithm::Auto && modelled_link.value_or(false))) {
    throw InvalidArgument(
        std::string("--per-node is read only by the hierarchical all-reduce (--algorithm hierarchical") +
        (modelled_link ? ", or auto over a modelled --link-bandwidth/--link-latency" : "") +
        "); with --algorithm " + comm::to_string(algorithm) +
        (modelled_link && !*modelled_link ? " and no modelled link" : "") +
        " it would be ignored. Drop it, or give --algorithm hierarchical.");
  }
  if (threads && f.per_node == 0 && algorithm == comm::Algorithm::Hierarchical) {
    throw InvalidArgument("--algorithm hierarchical needs to know which replicas share a node: give --per-node G "
                          "(in-process replicas, G to a node), or run processes on several hosts (lockstep launch, "
                          "docs/multi-machine.md).");
  }
}

int mpirun_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* env = std::getenv(name);
    if (env == nullptr || *env == '\0') continue;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end == '\0' && v >= 1 && v <= (1 << 20)) return static_cast<int>(v);
  }
  return -1;
}

void check_group_flags(const CLI::App& cmd, const ProcessGroupFlags& f) {
  const comm::Backend backend = backend_of(f);
  if (const int launched = mpirun_world_size(); backend == comm::Backend::Threads && launched > 1) {
    throw InvalidArgument("this is one of " + std::to_string(launched) +
                          " processes started by mpirun, but without --backend mpi each would run alone, with "
                          "replicas of its own; add --backend mpi.");
  }
  if (backend == comm::Backend::Gloo) return;
  for (const char* flag : {"--rank", "--world-size", "--rendezvous", "--bind", "--job-id", "--secret-file",
                           "--rendezvous-timeout"}) {
    if (cmd.get_option(flag)->count() == 0) continue;
    // MPI's start-up is bounded by it (Note [MPI's start-up has no timeout]).
    if (backend == comm::Backend::Mpi && std::string_view(flag) == "--rendezvous-timeout") continue;
    if (backend == comm::Backend::Threads) {
      throw InvalidArgument(std::string(flag) + " is for a group of processes (--backend gloo or mpi); with "
                            "--backend threads every replica is a thread of this process and it has no effect. "
                            "Give --backend gloo, or leave it out.");
    }
    const bool rank_flag = std::string_view(flag) == "--rank" || std::string_view(flag) == "--world-size";
    if (!rank_flag) {  // MPI checks --rank and --world-size against its own
      throw InvalidArgument(std::string(flag) + " is for --backend gloo, whose ranks meet and connect themselves; "
                            "under mpirun MPI connects them and it has no effect. Leave it out.");
    }
  }
}

comm::Backend backend_of(const ProcessGroupFlags& flags) { return comm::backend_from_string(flags.backend); }

comm::ProcessGroupOptions process_group_options(const ProcessGroupFlags& f, std::ostream& warnings) {
  if (!(f.rendezvous_timeout_s > 0)) {  // NaN: a bad LOCKSTEP_RENDEZVOUS_TIMEOUT
    const char* env = std::getenv("LOCKSTEP_RENDEZVOUS_TIMEOUT");
    throw InvalidArgument("LOCKSTEP_RENDEZVOUS_TIMEOUT must be a number of seconds up to 1e6, got '" +
                          std::string(env != nullptr ? env : "") + "'");
  }
  comm::ProcessGroupOptions o;
  o.rank = f.rank;
  o.world_size = f.world_size;
  o.rendezvous = f.rendezvous;
  o.bind = f.bind;
  o.job_id = f.job_id;
  o.secret_file = f.secret_file;
  o.timeout = seconds(f.timeout_s);
  o.rendezvous_timeout = seconds(f.rendezvous_timeout_s);
  // $RANK, $WORLD_SIZE and the rendezvous variables are Gloo's: under mpirun,
  // MPI assigns ranks, and a stray $RANK must not contradict it.
  if (backend_of(f) != comm::Backend::Mpi) o = comm::with_environment(o);
  if (backend_of(f) == comm::Backend::Gloo && o.secret_file.empty() && o.rendezvous.rfind("redis://", 0) == 0) {
    warnings << "lockstep: warning: no --secret-file: this job is open to anyone who can reach its ports "
                "(give every rank the same owner-only --secret-file)\n";
  }
  return o;
}

std::unique_ptr<comm::Communicator> connect_process_group(const ProcessGroupFlags& flags) {
  const comm::Backend backend = backend_of(flags);
  if (backend == comm::Backend::Threads) throw InvalidArgument("connect_process_group: not for --backend threads");
  return connect_group(flags, process_group_options(flags, std::cerr));
}

std::unique_ptr<comm::Communicator> connect_group(const ProcessGroupFlags& flags,
                                                  const comm::ProcessGroupOptions& options) {
  const comm::Backend backend = backend_of(flags);
  if (backend != comm::Backend::Mpi) return comm::connect(backend, options);
  const double limit_s = flags.rendezvous_timeout_s + 2 * flags.timeout_s;
  char limit_text[32];
  std::snprintf(limit_text, sizeof limit_text, "%g", limit_s);
  const ConnectWatchdog watchdog(
      std::chrono::duration<double>(limit_s),
      "lockstep: error: " + mpirun_rank_text() + "MPI's start-up did not finish within " + limit_text +
          " s (--rendezvous-timeout plus twice --timeout): a process of this job has not reached it (stopped, hung, "
          "or still loading its data, which every rank does first). Find the rank that is behind; if it is only "
          "slow, raise --rendezvous-timeout.\n");
  return comm::connect(backend, options);
}

int ranks_here_before_rendezvous(const ProcessGroupFlags& flags) {
  comm::ProcessGroupOptions o;
  o.rank = 0;  // not read from the environment here
  o.world_size = flags.world_size;
  const int world = comm::with_environment(o).world_size;
  return world > 0 ? train::local_world_size(world) : 1;
}

}  // namespace lockstep::cli
