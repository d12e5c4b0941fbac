// Failures over the MPI backend, on every rank of `mpirun -np N`: a silent
// peer times out naming rank, peer and tag; abort, a timeout and a size
// mismatch reach every rank with the reason (Note [Abort over MPI]); a
// mismatched call names both calls. Each test connects a communicator of
// its own, since it ends aborted.
#include <gtest/gtest.h>

#include <chrono>

#include "lockstep/comm/collectives.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/error.h"

namespace lockstep::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MpiFailure, RecvFromASilentPeerTimesOutNamingRankPeerAndTag) {
  auto comm = connect_mpi({.timeout = milliseconds(500)});
  std::vector<std::byte> buf(16);
  if (comm->rank() == 1) {
    // Rank 0 never sends.
    const auto start = Clock::now();
    try {
      comm->irecv(0, 7, buf)->wait(comm->timeout());
      ADD_FAILURE() << "rank 1: recv from a silent peer returned";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "rank 1: recv from rank 0 timed out after 500 ms (tag 7)"),
                std::string::npos)
          << e.what();
    }
    // Generous slack: the machine may be oversubscribed; the point is "not forever".
    EXPECT_LT(Clock::now() - start, milliseconds(500) + std::chrono::seconds(10));
  } else {
    // The timeout aborted the group: the others, waiting on something else, hear of it.
    const std::string what = message_of([&] { comm->irecv(1, 8, buf)->wait(std::chrono::seconds(30)); });
    EXPECT_NE(what.find("communicator aborted: rank 1: recv from rank 0 timed out"), std::string::npos)
        << what;
  }
  // Every later call fails at once.
  std::vector<float> data(10, 1.0f);
  EXPECT_THROW(allreduce(*comm, data, {.op = ReduceOp::Sum}), CommAborted);
}

// A collective's fingerprint check that times out names the call: the
// fingerprint channel's tag has no sequence number of its own.
TEST(MpiFailure, AFingerprintCheckTimeoutNamesTheCollective) {
  auto comm = connect_mpi({.timeout = milliseconds(500)});
  // Only rank 0 times out on its own; the others, waiting in the ring, hear of it.
  if (comm->rank() != 0) comm->set_timeout(std::chrono::seconds(20));
  const int last = comm->size() - 1;
  std::vector<float> data(10, 1.0f);
  if (comm->rank() == last) {
    // Never calls the all-reduce; hears of the others' failure instead.
    std::vector<std::byte> buf(16);
    const std::string what = message_of([&] { comm->irecv(0, 8, buf)->wait(std::chrono::seconds(30)); });
    EXPECT_NE(what.find("communicator aborted"), std::string::npos) << what;
    return;
  }
  const std::string what =
      message_of([&] { allreduce(*comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring}); });
  if (comm->rank() == 0) {  // its left neighbour is the silent rank: its check times out
    EXPECT_NE(what.find("allreduce(sum, float32, 10 elements, seq 0, ring): rank 0: recv from rank " +
                        std::to_string(last) + " timed out after 500 ms"),
              std::string::npos)
        << what;
  } else {
    EXPECT_FALSE(what.empty()) << "rank " << comm->rank() << " finished an all-reduce the last rank never joined";
  }
}

TEST(MpiFailure, AbortOnOneRankWakesEveryRankWithTheReason) {
  auto comm = connect_mpi({.timeout = std::chrono::seconds(30)});
  const int last = comm->size() - 1;
  std::vector<float> data(1000, 1.0f);
  if (comm->rank() == last) {
    comm->abort("rank " + std::to_string(last) + ": replica failed in backward");
    return;
  }
  const auto start = Clock::now();
  const std::string what = message_of([&] { allreduce(*comm, data, {.op = ReduceOp::Sum}); });
  EXPECT_NE(what.find("replica failed in backward"), std::string::npos) << what;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20)) << "woke by timeout, not by the abort";
}

TEST(MpiFailure, SizeMismatchAbortsTheGroup) {
  for (auto algorithm : {Algorithm::Naive, Algorithm::Ring}) {
    auto comm = connect_mpi({.timeout = std::chrono::seconds(20)});
    // verify = false: the transport's own size check, not the fingerprint, must catch it.
    std::vector<float> data(comm->rank() == 0 ? 10 : 11, 1.0f);
    const std::string what = message_of(
        [&] { allreduce(*comm, data, {.op = ReduceOp::Sum, .algorithm = algorithm, .verify = false}); });
    EXPECT_NE(what.find("bytes"), std::string::npos) << to_string(algorithm) << ": " << what;
  }
}

TEST(MpiFailure, MismatchedCallsNameBothCalls) {
  auto comm = connect_mpi({.timeout = std::chrono::seconds(20)});
  std::vector<float> data(100, 1.0f);
  const auto op = comm->rank() == 0 ? ReduceOp::Max : ReduceOp::Sum;
  const std::string what =
      message_of([&] { allreduce(*comm, data, {.op = op, .algorithm = Algorithm::Native}); });
  EXPECT_NE(what.find("collective mismatch"), std::string::npos) << what;
  EXPECT_NE(what.find("allreduce(max"), std::string::npos) << what;
  EXPECT_NE(what.find("allreduce(sum"), std::string::npos) << what;
}

TEST(MpiFailure, SharedMemoryNeedsTheThreadsBackend) {
  auto comm = connect_mpi({.timeout = std::chrono::seconds(20)});
  std::vector<float> data(10, 1.0f);
  // InvalidArgument here, or CommAborted if another rank's refusal (which
  // aborts the group) arrives first: either way it names the reason.
  const std::string what =
      message_of([&] { allreduce(*comm, data, {.algorithm = Algorithm::SharedMemory}); });
  EXPECT_NE(what.find("needs the threads backend"), std::string::npos) << what;
}

TEST(MpiFailure, RankAndWorldSizeMustAgreeWithMpi) {
  EXPECT_THROW(connect_mpi({.world_size = 1000}), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::comm
