// main() of lockstep_mpi_tests, which CTest runs as `mpirun -np N`.
//
// Every rank runs every test. Rank 0 prints GoogleTest's usual output; the
// other ranks print only their failures, prefixed by their rank. The exit
// code is non-zero on any rank whose tests failed, and mpirun passes that on.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "lockstep/comm/process_group.h"
#include "lockstep/error.h"
#include "mpi_rank.h"

namespace lockstep::testing {
namespace {

std::unique_ptr<comm::Communicator>& world_slot() {
  static std::unique_ptr<comm::Communicator> world;
  return world;
}

class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

comm::Communicator& mpi_world() {
  return *world_slot();
}

}  // namespace lockstep::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto& world = lockstep::testing::world_slot();
  lockstep::comm::ProcessGroupOptions options{.timeout = std::chrono::seconds(10)};
  // mpi_build_test.sh: a rank that states another build.
  if (const char* build = std::getenv("LOCKSTEP_TEST_BUILD")) options.build = build;
  try {
    world = lockstep::comm::connect_mpi(options);
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "lockstep_mpi_tests: %s\n", e.what());
    return 2;
  }
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new lockstep::testing::FailuresOnly(world->rank()));
  }
  const int result = RUN_ALL_TESTS();
  world.reset();  // the last communicator: MPI_Finalize
  return result;
}
