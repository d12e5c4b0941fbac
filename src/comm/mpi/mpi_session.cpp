// MPI_Init_thread once per process, MPI_Finalize when the last communicator
// goes (Note [The one global] in mpi_session.h).
#include "mpi_session.h"

#include <mpi.h>

#include <string>

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

MpiSession::~MpiSession() {
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace lockstep::comm::detail
