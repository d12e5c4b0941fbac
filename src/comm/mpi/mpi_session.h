// Private: this process's MPI session (MPI_Init_thread .. MPI_Finalize).
//
// MPI can be initialised once per process and finalised once, after which it
// can never be used again. Every MPI communicator holds the session; the last
// one to go finalises MPI (only if lockstep initialised it: a program that
// called MPI_Init itself keeps MPI until its own MPI_Finalize).
//
// Note [The one global]: which session is live must be known process-wide,
// because MPI_Init is process-wide. MpiSession::acquire keeps a weak pointer
// to it behind a mutex (mpi_session.cpp); that is the only mutable state
// outside a communicator, and MPI forces it. Everything else MPI keeps
// (MPI_Initialized, MPI_Finalized) is asked from MPI.
//
// Threads: MPI_THREAD_MULTIPLE when the library offers it, else
// MPI_THREAD_SERIALIZED. Under SERIALIZED every MPI call of lockstep takes
// lock() first, so a communicator used by its communication thread and by
// the main thread (never at once, but abort() may come from anywhere) never
// makes two MPI calls at the same time.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

namespace lockstep::comm::detail {

class MpiSession {
 public:
  // Initialises MPI on first use; throws lockstep::Error if MPI was already
  // finalised in this process, or offers less than MPI_THREAD_SERIALIZED.
  static std::shared_ptr<MpiSession> acquire();
  ~MpiSession();  // MPI_Finalize when this session initialised MPI (Note [MPI_Finalize after a failure])
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  // Held around every MPI call: a real lock under MPI_THREAD_SERIALIZED,
  // an empty one under MPI_THREAD_MULTIPLE.
  std::unique_lock<std::mutex> lock() {
    return serialized_ ? std::unique_lock<std::mutex>(mu_) : std::unique_lock<std::mutex>();
  }
  bool thread_multiple() const { return !serialized_; }
  // After a failure (an abort sent or received, a timeout, a refused
  // connect) the session finalises MPI only if every process shows up within
  // a few seconds: Note [MPI_Finalize after a failure] in mpi_session.cpp.
  void mark_failed() { failed_.store(true); }
  void note_timeout(std::chrono::milliseconds timeout);

 private:
  MpiSession(bool owns_mpi, bool serialized) : owns_mpi_(owns_mpi), serialized_(serialized) {}
  const bool owns_mpi_;
  const bool serialized_;
  std::mutex mu_;  // serialises MPI calls when !thread_multiple()
  std::atomic<bool> failed_{false};
  std::chrono::milliseconds longest_timeout_{std::chrono::seconds(60)};  // guarded by mu_
  bool timeout_noted_ = false;                                           // guarded by mu_
};

// Throws lockstep::Error naming `what` and MPI's message when rc is not MPI_SUCCESS.
void check_mpi(int rc, const char* what);

}  // namespace lockstep::comm::detail
