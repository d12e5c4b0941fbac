// The flags every command that can run as one rank of a process group
// shares (`lockstep train`, `lockstep bench allreduce`, and what `lockstep
// launch` passes on), parsed in one place:
//
//   --backend threads|gloo|mpi   --rank R --world-size N
//   --rendezvous file:DIR|redis://HOST:PORT   --bind ADDRESS   --job-id ID
//   --secret-file F   --rendezvous-timeout S   [--timeout S]
//
// Unset values come from the environment (RANK, WORLD_SIZE,
// LOCKSTEP_RENDEZVOUS, LOCKSTEP_SECRET_FILE; comm::with_environment), and
// the defaults of --backend and --rendezvous-timeout from LOCKSTEP_BACKEND
// and LOCKSTEP_RENDEZVOUS_TIMEOUT (what `lockstep launch` sets).
#pragma once

#include <optional>

#include <CLI/CLI.hpp>
#include <iosfwd>
#include <memory>
#include <string>

#include "lockstep/comm/process_group.h"

namespace lockstep::cli {

struct ProcessGroupFlags {
  std::string backend = "threads";
  int rank = -1;        // -1: RANK
  int world_size = -1;  // -1: WORLD_SIZE
  std::string rendezvous;
  std::string bind;
  std::string job_id = "lockstep";
  std::string secret_file;
  double timeout_s = 60;
  double rendezvous_timeout_s = 60;
  int per_node = 0;  // --backend threads: replicas per modelled node (0: one node)
};

// Adds the flags above to `cmd`, writing into `flags` (which must outlive
// parsing). `with_timeout` false leaves --timeout to the command (it then
// sets flags.timeout_s itself before connecting).
void add_process_group_flags(CLI::App& cmd, ProcessGroupFlags& flags, bool with_timeout = true);

comm::Backend backend_of(const ProcessGroupFlags& flags);  // throws InvalidArgument naming the choices

// --per-node against the backend, the replica count and the algorithm, before
// anything runs: in-process replicas know their nodes only from --per-node
// (a process group finds them from host names), and the hierarchical
// all-reduce needs them; and --per-node where nothing reads it is refused.
// `modelled_link`: whether the command models a link, if it can model one.
void check_nodes(const ProcessGroupFlags& flags, int replicas, comm::Algorithm algorithm,
                 std::optional<bool> modelled_link);
// With --backend threads, the flags that only a group of processes uses
// (--rank, --rendezvous, --secret-file, ...) are refused, naming the flag.
void check_group_flags(const CLI::App& cmd, const ProcessGroupFlags& flags);

// The number of processes mpirun started this one among (Open MPI's
// OMPI_COMM_WORLD_SIZE, or PMI_SIZE / PMIX_SIZE), or -1 outside mpirun.
int mpirun_world_size();

// The options the flags and the environment give. Writes a warning to
// `warnings` when the job will be reachable from other machines without a
// secret (a redis rendezvous and no --secret-file).
comm::ProcessGroupOptions process_group_options(const ProcessGroupFlags& flags, std::ostream& warnings);

// The group's ranks on this host, each with its own copy of what it loads, as
// the launcher says (train::local_world_size), when the world size is known
// before the rendezvous (--world-size, WORLD_SIZE); else 1.
int ranks_here_before_rendezvous(const ProcessGroupFlags& flags);

// comm::connect, and under --backend mpi a watchdog that ends the process
// (exit 1, naming the cause) if MPI's start-up outlasts --rendezvous-timeout
// plus twice --timeout (Note [MPI's start-up has no timeout]).
std::unique_ptr<comm::Communicator> connect_group(const ProcessGroupFlags& flags,
                                                  const comm::ProcessGroupOptions& options);

// process_group_options + connect_group, warnings to stderr. The backend must not be threads.
std::unique_ptr<comm::Communicator> connect_process_group(const ProcessGroupFlags& flags);

}  // namespace lockstep::cli
