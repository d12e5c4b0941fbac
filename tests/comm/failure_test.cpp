// A replica that fails before, during or after a collective, on rank 0 or on
// another rank, stops every rank within the timeout with an error that names
// the failed rank, the operation and its sequence number. Every case runs
// under run_ranks' wall-clock guard, so a hang fails the test.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "lockstep/comm/collectives.h"
#include "lockstep/comm/modelled_link.h"
#include "lockstep/comm/threads.h"
#include "lockstep/error.h"
#include "p2p_only.h"
#include "run_ranks.h"

namespace lockstep::comm {
namespace {

using testing::PointToPointOnly;
using testing::run_ranks;

constexpr int kRanks = 5;  // not a power of two: halving-doubling folds
constexpr auto kTimeout = std::chrono::milliseconds(500);

enum class Phase { Before, During, After };

struct FailureCase {
  Algorithm algorithm;
  Phase phase;
  int failing_rank;
  int fail_after_sends;  // for During
};

std::string name(const FailureCase& c) {
  const char* phases[] = {"before", "during", "after"};
  return std::string(to_string(c.algorithm)) + "_" + phases[int(c.phase)] + "_rank" +
         std::to_string(c.failing_rank) +
         (c.phase == Phase::During ? "_send" + std::to_string(c.fail_after_sends) : "");
}

class FailureInEveryPhase : public ::testing::TestWithParam<FailureCase> {};

TEST_P(FailureInEveryPhase, EveryRankStopsWithANamedError) {
  const FailureCase c = GetParam();
  const bool native = c.algorithm == Algorithm::SharedMemory;
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks(
      kRanks,
      [&](Communicator& inner) {
        const bool failing = inner.rank() == c.failing_rank;
        PointToPointOnly p2p(inner, failing && c.phase == Phase::During ? c.fail_after_sends : -1);
        Communicator& comm = native ? inner : static_cast<Communicator&>(p2p);
        std::vector<float> data(1000, 1.0f);
        const AllreduceOptions options{.op = ReduceOp::Sum, .algorithm = c.algorithm};
        if (failing && c.phase == Phase::Before) {
          comm.abort("rank " + std::to_string(c.failing_rank) + " failed before the collective");
          throw Error("failed before");
        }
        allreduce(comm, data, options);  // seq 0
        if (failing && c.phase == Phase::After) {
          comm.abort("rank " + std::to_string(c.failing_rank) + " failed after the collective");
          throw Error("failed after");
        }
        allreduce(comm, data, options);  // seq 1
      },
      kTimeout, std::chrono::seconds(20));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3 * kTimeout) << "not woken within the timeout";
  const std::string failed = "rank " + std::to_string(c.failing_rank);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " finished normally";
    if (r == c.failing_rank) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(failed), std::string::npos) << "rank " << r << ": " << what;
      // The operation and its sequence number: the call this rank was in.
      EXPECT_NE(what.find("allreduce(sum, float32, 1000 elements, seq "), std::string::npos)
          << "rank " << r << ": " << what;
      if (c.phase == Phase::During) {  // which call the k-th send falls in depends on the algorithm
        EXPECT_NE(what.find(failed + " failed in allreduce(sum, float32, 1000 elements, seq "),
                  std::string::npos)
            << "rank " << r << ": " << what;
      }
    }
  }
}

std::vector<FailureCase> all_cases() {
  std::vector<FailureCase> cases;
  for (auto a : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Naive, Algorithm::SharedMemory}) {
    for (int rank : {0, 3}) {
      cases.push_back({a, Phase::Before, rank, -1});
      cases.push_back({a, Phase::After, rank, -1});
      if (a == Algorithm::SharedMemory) continue;  // no sends to fail in
      for (int k : {0, 1, 3}) cases.push_back({a, Phase::During, rank, k});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Grid, FailureInEveryPhase, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return name(info.param); });

// A group whose every blocking call would time out at once is refused when
// it is made, as is a size no group can have.
TEST(ThreadGroup, ImpossibleOptionsAreRefused) {
  EXPECT_THROW(make_thread_group({.world_size = 2, .timeout = Duration::zero()}), InvalidArgument);
  EXPECT_THROW(make_thread_group({.world_size = 2, .timeout = Duration(-5)}), InvalidArgument);
  EXPECT_THROW(make_thread_group({.world_size = 0}), InvalidArgument);
  EXPECT_THROW(make_thread_group({.world_size = 1025}), InvalidArgument);
  EXPECT_EQ(make_thread_group({.world_size = 2, .timeout = Duration(1)}).size(), 2u);
}

// Duration::max() means "wait as long as it takes". The deadlines used to be
// now + timeout, which overflowed into the past: the first wait timed out at
// once and aborted the group (a library user's review; UBSan: signed overflow).
TEST(ThreadGroup, TheLongestTimeoutWaitsInsteadOfOverflowing) {
  using TimePoint = std::chrono::steady_clock::time_point;
  const TimePoint t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(deadline_after(Duration::max(), t0), TimePoint::max());
  EXPECT_EQ(deadline_after(Duration(5), t0), t0 + Duration(5));
  EXPECT_EQ(deadline_after(Duration(-5), t0), t0);
  EXPECT_EQ(deadline_after(Duration(5), TimePoint::max() - Duration(1)), TimePoint::max());

  for (const bool link : {false, true}) {
    auto group = make_thread_group({.world_size = 3, .timeout = Duration::max()});
    if (link) group = with_modelled_link(std::move(group), {.bytes_per_second = 1e9, .latency = std::chrono::microseconds(10)});
    testing::rethrow_first(testing::run_group(group, [](Communicator& comm) {
      // The others wait for rank 2 (a barrier, a receive and the all-reduce's rounds).
      if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::vector<float> data(5000, 1.0f);
      allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring});
      EXPECT_EQ(data[4999], 3.0f);
      if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      allreduce(comm, data, {.op = ReduceOp::Sum});
      EXPECT_EQ(data[0], 9.0f);
    }));
  }
}

// A timeout names what the rank waited for: a program's own message by its
// tag, a collective's by its sequence number and round. Tags share one space
// with the collectives', and a program's tag 7 used to be reported as
// "collective seq 0, round 7".
TEST(ThreadGroup, ATimeoutNamesAProgramsTagAndACollectivesRound) {
  auto program = run_ranks(
      2,
      [](Communicator& comm) {
        std::vector<std::byte> buf(16);
        if (comm.rank() == 1) comm.irecv(0, 7, buf)->wait(std::chrono::milliseconds(100));  // never sent
      },
      std::chrono::seconds(10));
  const auto expect_timeout_naming = [](const std::exception_ptr& error, const std::string& text) {
    ASSERT_TRUE(error);
    try {
      std::rethrow_exception(error);
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_timeout_naming(program[1], "recv from rank 0 timed out after 100 ms (tag 7)");

  auto collective = run_ranks(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));  // late to its first round
          return;
        }
        std::vector<float> data(64, 1.0f);
        allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring, .verify = false});
      },
      std::chrono::milliseconds(100));
  expect_timeout_naming(collective[1], "timed out after 100 ms (collective seq 0, round 0)");
}

// Tags of 2^62 and above are the library's: a program's message there could
// be taken by a collective's receive (a review made one rank's all-reduce
// return the program's bytes, silently). isend and irecv refuse them, and
// the peer waiting for the message hears of it at once.
TEST(ThreadGroup, AProgramsTagInTheLibrarysRangeIsRefused) {
  auto errors = run_ranks(
      2,
      [](Communicator& comm) {
        std::vector<std::byte> buf(16);
        if (comm.rank() == 0) {
          EXPECT_THROW(comm.isend(1, std::uint64_t{1} << 62, buf), InvalidArgument);
          EXPECT_THROW(comm.irecv(1, ~std::uint64_t{0}, buf), InvalidArgument);
        } else {
          comm.irecv(0, 3, buf)->wait(std::chrono::seconds(30));  // woken by the abort, not the timeout
        }
      },
      std::chrono::seconds(30));
  EXPECT_FALSE(errors[0]);
  ASSERT_TRUE(errors[1]);
  try {
    std::rethrow_exception(errors[1]);
  } catch (const CommAborted& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: isend was given tag 4611686018427387904, which is the library's"),
              std::string::npos)
        << e.what();
  }
}

// An algorithm the group cannot run, asked for by one rank only: refused
// there, and the group aborted, so the ranks that went on into their ring
// wake with the reason instead of waiting out their timeout.
TEST(ThreadGroup, AnAlgorithmOneRankCannotRunStopsEveryRankAtOnce) {
  auto errors = run_ranks(
      3,
      [](Communicator& comm) {
        std::vector<float> data(1000, 1.0f);
        allreduce(comm, data, {.algorithm = comm.rank() == 0 ? Algorithm::Tree : Algorithm::Ring});
      },
      std::chrono::seconds(30));
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), InvalidArgument);
  for (int r : {1, 2}) {
    ASSERT_TRUE(errors[r]) << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CommAborted& e) {
      EXPECT_NE(std::string(e.what()).find("power-of-two number of ranks, not 3"), std::string::npos) << e.what();
    }
  }
}

// A rank's thread that fails without aborting, and whose communicator is
// destroyed as the exception unwinds, aborts the group: the others learn of
// it at once instead of waiting out their timeout to blame it with no cause.
// A communicator destroyed normally (its rank done first) aborts nothing.
TEST(ThreadGroup, ACommunicatorDestroyedByAnExceptionAbortsTheGroup) {
  auto comms = make_thread_group({.world_size = 3, .timeout = std::chrono::seconds(30)});
  comms[2].reset();  // done: the others go on
  std::vector<std::byte> buf(4);
  auto sent = comms[0]->isend(1, 5, buf);
  comms[1]->irecv(0, 5, buf)->wait(std::chrono::seconds(30));
  sent->wait(std::chrono::seconds(30));
  EXPECT_EQ(comms[0]->abort_reason(), "");

  std::thread failing([owned = std::move(comms[1])]() mutable {
    try {
      const auto mine = std::move(owned);
      throw Error("rank 1's step failed");
    } catch (const Error&) {
    }
  });
  failing.join();
  try {
    comms[0]->irecv(1, 6, buf)->wait(std::chrono::seconds(30));
    ADD_FAILURE() << "a receive from the failed rank returned";
  } catch (const CommAborted& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1's communicator was destroyed while an exception unwound"),
              std::string::npos)
        << e.what();
  }
}

// A transfer that failed (its wait timed out, or the group was aborted)
// never completed: a second wait() returned as if it had, with nothing in the
// buffer, and done() said true. Both now say it failed, as later calls do.
TEST(ThreadGroup, AFailedTransferStaysFailed) {
  for (const bool timed_out : {true, false}) {
    SCOPED_TRACE(timed_out ? "timed out" : "aborted");
    auto comms = make_thread_group({.world_size = 2, .timeout = std::chrono::seconds(30)});
    std::vector<std::byte> buf(4, std::byte{0});
    auto received = comms[0]->irecv(1, 7, buf);
    auto sent = comms[1]->isend(0, 8, buf);  // another tag: never matched
    if (timed_out) {
      EXPECT_THROW(received->wait(std::chrono::milliseconds(10)), TimeoutError);
    } else {
      comms[1]->abort("rank 1 failed");
      EXPECT_THROW(received->wait(std::chrono::seconds(30)), CommAborted);
    }
    EXPECT_THROW(sent->wait(std::chrono::seconds(30)), CommAborted);
    for (auto* work : {received.get(), sent.get()}) {
      EXPECT_FALSE(work->done());
      EXPECT_THROW(work->wait(std::chrono::seconds(30)), CommAborted);
    }
  }
}

// One communicator, two threads: a collective started while another runs on
// the same communicator is refused by name (it drew the next sequence number
// in a data race and failed, if at all, as a garbled fingerprint mismatch).
TEST(ThreadGroup, ASecondCollectiveFromAnotherThreadIsRefusedByName) {
  std::string refusal;
  std::atomic<bool> tried{false};  // rank 1's second thread has called its broadcast
  auto errors = run_ranks(
      2,
      [&](Communicator& comm) {
        std::vector<float> data(1000, 1.0f);
        if (comm.rank() == 1) {
          // Rank 1 starts an all-reduce that waits for rank 0, and from a second
          // thread a broadcast on the same communicator.
          std::thread second([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            try {
              std::vector<std::byte> b(8);
              broadcast(comm, b, 0);
            } catch (const InvalidArgument& e) {
              refusal = e.what();
            } catch (const Error&) {  // it came first, and the all-reduce's refusal aborted it
            }
            tried = true;
          });
          try {
            allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring});
          } catch (const InvalidArgument& e) {  // the broadcast came first (a slow start under TSan)
            second.join();
            refusal = e.what();
            throw;
          } catch (...) {
            second.join();
            throw;
          }
          second.join();
        } else {
          // Rank 1 waits in its all-reduce until its second thread has tried (however late
          // the OS runs it: a fixed sleep here could end first under load).
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (!tried && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring});
        }
      },
      std::chrono::seconds(30));
  EXPECT_NE(refusal.find(" was called while another collective runs on the same communicator"), std::string::npos)
      << refusal;
  ASSERT_TRUE(errors[0]);  // the refusal aborted the group
  EXPECT_THROW(std::rethrow_exception(errors[0]), CommAborted);
}

// The cause of a group's failure, not its consequence: the first error that
// is not the abort every other thread then met (the trainer and bench
// allreduce report it).
TEST(Failure, TheFirstCauseIsRethrownNotTheAbortsItCaused) {
  const auto error = [](auto e) { return std::make_exception_ptr(e); };
  const std::vector<std::exception_ptr> errors = {error(CommAborted("aborted: rank 2 timed out")), nullptr,
                                                  error(TimeoutError("rank 2 timed out")),
                                                  error(InvalidArgument("later"))};
  try {
    rethrow_first_cause(errors);
    ADD_FAILURE() << "nothing rethrown";
  } catch (const TimeoutError& e) {
    EXPECT_STREQ(e.what(), "rank 2 timed out");
  }
  const std::vector<std::exception_ptr> aborts = {nullptr, error(CommAborted("first")), error(CommAborted("second"))};
  try {
    rethrow_first_cause(aborts);
    ADD_FAILURE() << "nothing rethrown";
  } catch (const CommAborted& e) {
    EXPECT_STREQ(e.what(), "first");
  }
  EXPECT_NO_THROW(rethrow_first_cause(std::vector<std::exception_ptr>(3)));
}

}  // namespace
}  // namespace lockstep::comm
