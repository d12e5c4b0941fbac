// MPI_Init_thread once per process, MPI_Finalize when the last communicator
// goes (Note [The one global] in mpi_session.h).
#include "mpi_session.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "lockstep/error.h"

namespace lockstep::comm::detail {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string(what) + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

std::shared_ptr<MpiSession> MpiSession::acquire() {
  // Note [The one global]: MPI itself is process-wide, so is this.
  static std::mutex mu;
  static std::weak_ptr<MpiSession> current;  // guarded by mu
  std::lock_guard lock(mu);
  if (auto live = current.lock()) return live;

  int finalized = 0, initialized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw Error(
        "MPI was already finalised in this process and cannot be initialised again: keep one MPI "
        "communicator alive for as long as the process uses MPI");
  }
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    // We may not finalise here: a later connect could not initialise again either way.
    throw Error("the MPI library offers thread level " + std::to_string(provided) +
                "; lockstep needs MPI_THREAD_SERIALIZED or better (its reducer calls MPI from a "
                "communication thread)");
  }
  std::shared_ptr<MpiSession> session(new MpiSession(!initialized, provided < MPI_THREAD_MULTIPLE));
  current = session;
  return session;
}

void MpiSession::note_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard guard(mu_);
  longest_timeout_ = timeout_noted_ ? std::max(longest_timeout_, timeout) : timeout;
  timeout_noted_ = true;
}

// Note [MPI_Finalize after a failure]: MPI_Finalize waits for every process
// of the job (OpenMPI ends it with a fence over all of them), so after a
// failure, with a peer stopped, hung, gone, or still inside the connect
// protocol a refusing rank left, it would block forever (or until the peers'
// own timeout) and the error would never be printed. After a failure the
// session first polls a barrier over MPI_COMM_WORLD for at most kGrace (or
// the longest communicator timeout, if shorter): if every process arrives
// (all failed cleanly and are finishing, as in the tests' injected failures),
// MPI is finalised; if not, it is left as it is, the process exits non-zero,
// and mpirun ends the job ("... returned a non-zero exit code ... the job has
// been aborted"). A session that saw no failure finalises at once.
MpiSession::~MpiSession() {
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (failed_.load()) {
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &request) != MPI_SUCCESS) return;
    constexpr std::chrono::milliseconds kGrace{3000};
    const auto deadline = std::chrono::steady_clock::now() + std::min(kGrace, longest_timeout_);
    int done = 0;
    while (!done) {
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
      if (done) break;
      if (std::chrono::steady_clock::now() >= deadline) return;  // a peer is not coming
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  MPI_Finalize();
}

}  // namespace lockstep::comm::detail
