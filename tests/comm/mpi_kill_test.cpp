// One rank of `mpirun -np N` dies (SIGKILL) or stops (SIGSTOP) in the middle
// of a loop of all-reduces. Disabled in the normal run (they end the job on
// purpose); mpi_kill_test.sh runs them and checks what mpirun does: the job
// ends, non-zero, naming the dead rank or printing the others' timeout, and
// no process is left behind.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "lockstep/comm/collectives.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/error.h"
#include "mpi_rank.h"

namespace lockstep::comm {
namespace {

TEST(MpiKill, DISABLED_OneRankDiesDuringAllreduces) {
  Communicator& comm = testing::mpi_world();
  const char* victim = std::getenv("LOCKSTEP_TEST_KILL_RANK");
  const int dies = victim != nullptr ? std::atoi(victim) : 1;
  std::vector<float> data(1 << 18, 1.0f);
  // The others keep going until mpirun stops them (or, were it not to, until
  // their timeout: the script would then see lockstep's error instead).
  for (int step = 0; step < 1000000; ++step) {
    if (step == 20 && comm.rank() == dies) std::raise(SIGKILL);
    allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring});
    std::fill(data.begin(), data.end(), 1.0f);
  }
}

// A stopped rank is neither dead nor alive to mpirun: the others' all-reduce
// times out, and then MPI_Finalize would wait for the stopped rank forever
// (Note [MPI_Finalize after a failure]). Each other rank prints its error and
// returns; its session must skip MPI_Finalize after the grace, so that the
// process exits and mpirun ends the job.
TEST(MpiKill, DISABLED_OneRankStopsDuringAllreduces) {
  auto comm = connect_mpi({.timeout = std::chrono::seconds(2)});
  const char* victim = std::getenv("LOCKSTEP_TEST_KILL_RANK");
  const int stops = victim != nullptr ? std::atoi(victim) : 1;
  std::vector<float> data(1 << 12, 1.0f);
  try {
    for (int step = 0; step < 1000000; ++step) {
      if (step == 20 && comm->rank() == stops) std::raise(SIGSTOP);
      allreduce(*comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring});
      std::fill(data.begin(), data.end(), 1.0f);
    }
    ADD_FAILURE() << "rank " << comm->rank() << ": a million all-reduces with a stopped rank";
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d failed as expected: %s\n", comm->rank(), e.what());
  }
}

// A rank stopped before it connects: the others' connect (MPI_Comm_idup,
// polled) times out instead of waiting for it in MPI_Comm_dup forever, and
// they exit as above.
TEST(MpiKill, DISABLED_OneRankStopsBeforeConnecting) {
  const char* victim = std::getenv("LOCKSTEP_TEST_KILL_RANK");
  const int stops = victim != nullptr ? std::atoi(victim) : 1;
  if (testing::mpi_world().rank() == stops) std::raise(SIGSTOP);
  try {
    auto comm = connect_mpi({.timeout = std::chrono::seconds(2)});
    ADD_FAILURE() << "rank " << comm->rank() << ": connected without the stopped rank";
  } catch (const TimeoutError& e) {
    std::fprintf(stderr, "rank %d failed as expected: %s\n", testing::mpi_world().rank(), e.what());
  }
}

}  // namespace
}  // namespace lockstep::comm
