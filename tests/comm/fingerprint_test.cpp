// Mismatched collective calls fail fast, on every rank, naming both sides.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <thread>

#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "p2p_only.h"
#include "run_ranks.h"

namespace lockstep::comm {
namespace {

using testing::run_ranks;

// Runs `body` on 4 ranks; every rank must fail with CommAborted (or
// TimeoutError for none: the check must not wait for a timeout), and at least
// one message must name the mismatch with both calls.
void expect_mismatch(const std::function<void(Communicator&)>& body, const std::string& must_contain) {
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks(4, body, std::chrono::seconds(5));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3)) << "waited for a timeout";
  bool named = false;
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CommAborted& e) {
      const std::string what = e.what();
      if (what.find("collective mismatch") != std::string::npos &&
          what.find(must_contain) != std::string::npos)
        named = true;
    }
  }
  EXPECT_TRUE(named) << "no rank named the mismatch '" << must_contain << "'";
}

struct Case {
  Algorithm algorithm;
  bool p2p_only;  // through PointToPointOnly: the default ring check of fingerprints
};

class Mismatch : public ::testing::TestWithParam<Case> {
 protected:
  // Runs `body` on the rank's communicator, wrapped as the case asks.
  std::function<void(Communicator&)> on(std::function<void(Communicator&, Algorithm)> body) {
    const Case c = GetParam();
    return [c, body](Communicator& inner) {
      if (!c.p2p_only) return body(inner, c.algorithm);
      testing::PointToPointOnly p2p(inner);
      body(p2p, c.algorithm);
    };
  }
};

TEST_P(Mismatch, DifferentCount) {
  expect_mismatch(on([](Communicator& c, Algorithm a) {
                    std::vector<float> data(c.rank() == 2 ? 101 : 100, 1.0f);
                    allreduce(c, data, {.op = ReduceOp::Sum, .algorithm = a});
                  }),
                  "101 elements");
}

TEST_P(Mismatch, DifferentOp) {
  expect_mismatch(on([](Communicator& c, Algorithm a) {
                    std::vector<float> data(100, 1.0f);
                    allreduce(c, data, {.op = c.rank() == 1 ? ReduceOp::Max : ReduceOp::Sum, .algorithm = a});
                  }),
                  "allreduce(max");
}

TEST_P(Mismatch, SkippedCall) {
  expect_mismatch(on([](Communicator& c, Algorithm a) {
                    std::vector<float> first(10, 1.0f), second(20, 1.0f);
                    if (c.rank() != 3) allreduce(c, first, {.op = ReduceOp::Sum, .algorithm = a});
                    allreduce(c, second, {.op = ReduceOp::Sum, .algorithm = a});
                  }),
                  "seq 0");
}

TEST_P(Mismatch, DifferentOrderOfCalls) {
  expect_mismatch(on([](Communicator& c, Algorithm a) {
                    std::vector<float> data(10, 1.0f);
                    std::vector<std::byte> bytes(16);
                    if (c.rank() == 0) {
                      broadcast(c, bytes, 0);
                      allreduce(c, data, {.op = ReduceOp::Sum, .algorithm = a});
                    } else {
                      allreduce(c, data, {.op = ReduceOp::Sum, .algorithm = a});
                      broadcast(c, bytes, 0);
                    }
                  }),
                  "broadcast(");
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, Mismatch,
    ::testing::Values(Case{Algorithm::Ring, false}, Case{Algorithm::HalvingDoubling, false},
                      Case{Algorithm::Naive, false}, Case{Algorithm::SharedMemory, false},
                      Case{Algorithm::Ring, true}, Case{Algorithm::HalvingDoubling, true},
                      Case{Algorithm::Naive, true}),
    [](const auto& info) {
      return std::string(to_string(info.param.algorithm)) + (info.param.p2p_only ? "_p2p" : "_threads");
    });

// A rank on another algorithm would read stale buffers or never meet its
// peers; the resolved algorithm is part of the fingerprint.
TEST(Fingerprint, DifferentAlgorithmOnOneRankIsAMismatch) {
  expect_mismatch(
      [](Communicator& c) {
        std::vector<float> data(1000, 1.0f);
        allreduce(
            c, data,
            {.op = ReduceOp::Sum, .algorithm = c.rank() == 1 ? Algorithm::Ring : Algorithm::SharedMemory});
      },
      "ring)");
}

TEST(Fingerprint, DescribeNamesEveryField) {
  const Fingerprint fp{12,
                       CollectiveKind::Allreduce,
                       ReduceOp::Mean,
                       DataType::Float32,
                       1000,
                       -1,
                       static_cast<std::uint32_t>(Algorithm::Ring)};
  EXPECT_EQ(describe(fp), "allreduce(mean, float32, 1000 elements, seq 12, ring)");
  const Fingerprint b{3, CollectiveKind::Broadcast, ReduceOp::Sum, DataType::Bytes, 64, 2};
  EXPECT_EQ(describe(b), "broadcast(64 bytes, root 2, seq 3)");
  const Fingerprint one{4, CollectiveKind::Allreduce, ReduceOp::Max, DataType::Float32, 1};
  EXPECT_EQ(describe(one), "allreduce(max, float32, 1 element, seq 4)");
  const Fingerprint barrier{5, CollectiveKind::Barrier, ReduceOp::Sum, DataType::Float32, 1};
  EXPECT_EQ(describe(barrier), "barrier(seq 5)");
  Fingerprint batch = one;
  batch.global_batch = 256;
  EXPECT_EQ(describe(batch), "allreduce(max, float32, 1 element, seq 4, global batch of 256 samples)");
}

// A rank that skips the check (verify = false) and one that makes it: the
// shared-memory path compares fingerprints after its first barrier, and the
// rank that found the mismatch left while the other went on, wrote into its
// buffer and waited in the second barrier, which waits for every rank and
// has no timeout: it hung for good. Every rank now checks when any asked.
// The ranks run on a thread of their own, so that a hang fails the test
// instead of stalling it (run_ranks' guard cannot wake that barrier).
TEST(Fingerprint, ARankThatSkipsTheCheckStopsWhenAnotherFindsAMismatch) {
  enum class Call { Allreduce, ReduceScatter, AllGather };
  for (const Call call : {Call::Allreduce, Call::ReduceScatter, Call::AllGather}) {
    SCOPED_TRACE(static_cast<int>(call));
    auto errors = std::make_shared<std::vector<std::exception_ptr>>();
    auto finished = std::async(std::launch::async, [errors, call] {
      *errors = run_ranks(2, [call](Communicator& c) {
        std::vector<float> data(8192, 1.0f);  // 32 KiB: two barriers, not the staged path
        const bool verify = c.rank() == 0;
        // Another global batch on rank 1: what only the full fingerprint holds.
        const AllreduceOptions options{.op = ReduceOp::Mean,
                                       .algorithm = Algorithm::SharedMemory,
                                       .verify = verify,
                                       .global_batch = c.rank() == 0 ? 64u : 65u};
        if (call == Call::Allreduce) allreduce(c, data, options);
        if (call == Call::ReduceScatter) reduce_scatter_in_place(c, data, options);
        if (call == Call::AllGather) all_gather_in_place(c, data, options);
      });
    });
    if (finished.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "a rank hung after the mismatch";
      std::thread([f = std::move(finished)]() mutable { f.wait(); }).detach();  // leave it; the test failed
      return;
    }
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE((*errors)[r]) << "rank " << r << " finished normally";
      try {
        std::rethrow_exception((*errors)[r]);
      } catch (const CommAborted& e) {
        EXPECT_NE(std::string(e.what()).find("collective mismatch"), std::string::npos) << e.what();
      }
    }
  }
}

// An op outside the enum (only a cast makes one) reduced nothing and
// returned each rank's own input; now every rank fails, and a timeout that
// is not positive is refused where it is set.
TEST(Fingerprint, AnOpOutsideTheEnumAndATimeoutThatIsNotPositiveAreRefused) {
  const auto errors = run_ranks(2, [](Communicator& c) {
    std::vector<float> data(8, 1.0f);
    allreduce(c, data, {.op = static_cast<ReduceOp>(9)});
  });
  for (const auto& e : errors) EXPECT_TRUE(e);
  testing::rethrow_first(run_ranks(1, [](Communicator& c) {
    EXPECT_THROW(c.set_timeout(Duration(-5)), InvalidArgument);
    EXPECT_THROW(c.set_timeout(Duration(0)), InvalidArgument);
    c.set_timeout(Duration(5));
    EXPECT_EQ(c.timeout(), Duration(5));
  }));
}

}  // namespace
}  // namespace lockstep::comm
