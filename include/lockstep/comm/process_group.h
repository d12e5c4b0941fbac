// Communicators that span processes and machines, on existing engines:
// Gloo over TCP, and MPI. Both implement the same Communicator interface as
// the threads backend (communicator.h), so every collective algorithm, the
// reducer, the guards and the trainer run on them unchanged.
//
//   lockstep train --backend gloo --rank R --world-size N --rendezvous file:DIR
//   RANK=R WORLD_SIZE=N LOCKSTEP_RENDEZVOUS=redis://HOST:PORT lockstep train --backend gloo
//   mpirun -np N lockstep train --backend mpi
//   lockstep launch --nproc N -- train ...
//
// Each backend's own all-reduce (Gloo's ring, MPI_Allreduce) is offered as
// Algorithm::Native, for comparison; Auto never picks it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "lockstep/comm/communicator.h"
#include "lockstep/version.h"

namespace lockstep::comm {

enum class Backend { Threads, Gloo, Mpi };
const char* to_string(Backend backend);
Backend backend_from_string(const std::string& name);  // throws InvalidArgument naming the choices
// Whether this build has `backend` (Gloo and MPI are optional CMake targets).
bool backend_built(Backend backend);

struct ProcessGroupOptions {
  int rank = -1;        // -1: from the environment (RANK, or MPI's own)
  int world_size = -1;  // -1: from the environment (WORLD_SIZE, or MPI's own)
  // "file:DIR" (one host, or a shared filesystem) or "redis://HOST:PORT".
  // Empty: from LOCKSTEP_RENDEZVOUS. Gloo only.
  std::string rendezvous;
  // The address this rank listens on. Empty: loopback when the rendezvous is
  // a file (all ranks local), else the address of the interface that routes
  // to the rendezvous host. Never the wildcard address unless asked ("0.0.0.0").
  std::string bind;
  // Keeps jobs that share a rendezvous apart (a prefix of every key).
  std::string job_id = "lockstep";
  // A file readable only by its owner; every rank proves knowledge of its
  // contents to every peer before any data is exchanged. Empty: from
  // LOCKSTEP_SECRET_FILE, else none (a multi-machine rendezvous then warns).
  std::string secret_file;
  // Every rank of a group runs the same build: connect refuses a peer whose
  // `build` differs, naming both, before any collective (ranks of different
  // builds may call different collectives, or the same ones with other
  // meanings). A program may append its own version to lockstep's. At most
  // kMaxBuildIdBytes printable bytes, no spaces.
  static constexpr std::size_t kMaxBuildIdBytes = 128;
  std::string build = lockstep::build_id();
  Duration timeout{std::chrono::seconds(60)};             // every blocking call
  Duration rendezvous_timeout{std::chrono::seconds(60)};  // until every rank has joined
};

// `options` with what it leaves open filled from the environment: rank from
// RANK, world size from WORLD_SIZE, rendezvous from LOCKSTEP_RENDEZVOUS, secret
// file from LOCKSTEP_SECRET_FILE. Throws InvalidArgument for a malformed number.
// connect_gloo applies it itself; callers use it to see what will be used.
ProcessGroupOptions with_environment(ProcessGroupOptions options);

// Connects this process to its group. Blocks until every rank has joined or
// `rendezvous_timeout` has passed: then throws TimeoutError listing the
// missing ranks by number. A duplicate rank, ranks that disagree on the
// world size, and ranks of different builds (`build`) are refused at once
// (InvalidArgument).
//
// Gloo: every rank then proves the job secret to every peer (HMAC-SHA256 over
// fresh nonces from both sides, the job id and both ranks); a peer that fails
// is refused (lockstep::Error naming its rank and address). After that a
// broken connection or a timeout aborts the group: every rank fails within
// `timeout` with an error naming the rank that failed and the collective's
// sequence number. A secret file that is not owner-only is refused at once
// (InvalidArgument). Defined only in builds with the backend; connect() is
// always there and throws InvalidArgument for a backend that was not built.
std::unique_ptr<Communicator> connect_gloo(const ProcessGroupOptions& options);
// MPI: mpirun starts and connects the ranks, so rendezvous, bind, secret_file
// and rendezvous_timeout are not used; rank and world size come from MPI
// (options that state them must agree: InvalidArgument otherwise). The first
// MPI communicator of a process initialises MPI, the last one to go finalises
// it; MPI cannot be initialised again after that (lockstep::Error). A dead
// rank is mpirun's to handle: it stops the whole job (docs/errors.md).
std::unique_ptr<Communicator> connect_mpi(const ProcessGroupOptions& options);
// Dispatches on `backend` (not Threads).
std::unique_ptr<Communicator> connect(Backend backend, const ProcessGroupOptions& options);

}  // namespace lockstep::comm
