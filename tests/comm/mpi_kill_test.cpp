// One rank of `mpirun -np N` dies (SIGKILL) in the middle of a loop of
// all-reduces. Disabled in the normal run (it ends the job on purpose);
// mpi_kill_test.sh runs it and checks what mpirun does: the job ends, with
// a non-zero exit naming the dead rank, and no process is left behind.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>

#include "lockstep/comm/collectives.h"
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

}  // namespace
}  // namespace lockstep::comm
