// train_replica(): one replica per caller over an external communicator, as
// a process backend runs it. Here the "processes" are threads of a thread
// group, so the result can be held bit for bit against train() on the same
// group; tests/cli/launch_test.cpp runs the real processes.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "comm/run_ranks.h"
#include "lockstep/error.h"
#include "lockstep/nn/gemm.h"
#include "lockstep/train/trainer.h"
#include "synthetic_data.h"

namespace lockstep::train {
namespace {

using testing::run_group;
using testing::synthetic_data;

TrainConfig small_config(int replicas) {
  TrainConfig c;
  c.replicas = replicas;
  c.micro_batch = 8;
  c.hidden = {32};
  c.steps = 12;
  c.log_every = 5;
  c.stop_poll_ms = 1e9;  // votes at progress points (and after the first step) only: the control bytes compared below
  c.timeout = std::chrono::seconds(20);
  return c;
}

// train_replica sets the process-wide BLAS thread count from
// LOCAL_WORLD_SIZE; the replicas here are threads of one process, so set it
// up front to the value they will all ask for (then nobody changes it).
void pin_blas_threads(int replicas) {
  setenv("LOCAL_WORLD_SIZE", std::to_string(replicas).c_str(), 1);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  nn::set_blas_threads(replicas >= cores ? 1 : std::max(1, cores / replicas));
}

std::vector<TrainResult> run_replicas(const TrainConfig& c, const data::ImageClassificationData& data) {
  pin_blas_threads(c.replicas);
  std::vector<TrainResult> results(c.replicas);
  const auto errors =
      run_group(comm::make_thread_group({.world_size = c.replicas, .timeout = c.timeout}),
                [&](comm::Communicator& comm) { results[comm.rank()] = train_replica(c, data, comm); });
  testing::rethrow_first(errors);
  return results;
}

// Every rank ends with train()'s weights, loss and accuracy, bit for bit:
// same algorithm, same order of additions, one replica per caller.
// Also with the optimizer state sharded (--zero 1), where each rank updates
// its own shard and the weights are all-gathered.
TEST(TrainReplica, EveryRankMatchesTrainBitForBit) {
  const auto data = synthetic_data(600);
  for (int zero : {0, 1}) {
  for (int n : {1, 3, 4}) {
    if (zero == 1 && n == 1) continue;  // refused: nothing to shard with
    SCOPED_TRACE("replicas " + std::to_string(n) + ", zero " + std::to_string(zero));
    auto c = small_config(n);
    c.zero = zero;
    const auto whole = train(c, data);
    const auto ranks = run_replicas(c, data);
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const auto& one = ranks[r];
      ASSERT_FALSE(one.params.empty());
      EXPECT_EQ(one.params, whole.params);
      EXPECT_EQ(one.final_loss, whole.final_loss);
      EXPECT_EQ(one.test_accuracy, whole.test_accuracy);
      EXPECT_EQ(one.steps, whole.steps);
      EXPECT_EQ(one.samples_seen, whole.samples_seen);
      // The wait for the last replica needs every replica on one clock.
      EXPECT_FALSE(std::isnan(whole.times.comm_wait_ms));
      if (n > 1) {
        EXPECT_TRUE(std::isnan(one.times.comm_wait_ms));
      }
      // Every rank's traffic, the same bytes train() counted for each.
      ASSERT_EQ(one.traffic.size(), std::size_t(n));
      for (int q = 0; q < n; ++q) {
        EXPECT_EQ(one.traffic[q].gradients, whole.traffic[q].gradients);
        EXPECT_EQ(one.traffic[q].init_broadcast, whole.traffic[q].init_broadcast);
        EXPECT_EQ(one.traffic[q].control, whole.traffic[q].control);
        EXPECT_EQ(one.traffic[q].weights, whole.traffic[q].weights);
        if (zero == 1 && n > 1) {
          EXPECT_GT(one.traffic[q].weights, 0u);
        }
        EXPECT_EQ(one.traffic[q].unaccounted, 0u);
      }
    }
  }
  }
}

// The ranks that share this host's cores: torchrun's variable first, then
// mpirun's, else the whole world; a value outside [1, world] is named.
TEST(TrainReplica, LocalWorldSizeFromTorchrunOrMpirun) {
  ::unsetenv("LOCAL_WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  EXPECT_EQ(local_world_size(4), 4);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  EXPECT_EQ(local_world_size(4), 2);
  ::setenv("LOCAL_WORLD_SIZE", "1", 1);
  EXPECT_EQ(local_world_size(4), 1);
  ::unsetenv("LOCAL_WORLD_SIZE");
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8", 1);
  try {
    local_world_size(4);
    ADD_FAILURE() << "8 ranks on a host of a world of 4";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_LOCAL_SIZE must be between 1 and the world size (4)"),
              std::string::npos)
        << e.what();
  }
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
}

TEST(TrainReplica, RefusesReplicasThatDisagreeWithTheWorldSize) {
  const auto data = synthetic_data(200);
  auto comms = comm::make_thread_group({.world_size = 1});
  try {
    train_replica(small_config(4), data, *comms[0]);
    FAIL() << "trained with --replicas 4 on a group of 1";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--replicas 4"), std::string::npos) << what;
    EXPECT_NE(what.find("world size 1"), std::string::npos) << what;
  }
}

// A rank that fails aborts the group with its reason, so the other ranks
// stop at once (CommAborted naming it) instead of waiting for the timeout.
TEST(TrainReplica, AFailingRankStopsTheOthersWithItsReason) {
  const auto data = synthetic_data(600);
  auto c = small_config(3);
  c.timeout = std::chrono::seconds(600);  // a wait for the timeout would trip the guard below
  c.inject.push_back({.kind = Fault::Kind::Throw, .step = 2, .rank = 1});
  pin_blas_threads(c.replicas);
  const auto errors = run_group(
      comm::make_thread_group({.world_size = 3, .timeout = c.timeout}),
      [&](comm::Communicator& comm) { train_replica(c, data, comm); }, std::chrono::seconds(60));
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " finished";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CommAborted& e) {
      EXPECT_NE(r, 1);
      EXPECT_NE(std::string(e.what()).find("rank 1 failed"), std::string::npos) << e.what();
    } catch (const Error& e) {
      EXPECT_EQ(r, 1) << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep::train
