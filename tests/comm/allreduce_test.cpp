#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>

#include "closed_form.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "run_ranks.h"

namespace lockstep::comm {
namespace {

using testing::rethrow_first;
using testing::run_ranks;
namespace closed_form = testing::closed_form;

struct GridCase {
  Algorithm algorithm;
  ReduceOp op;
};

class AllreduceGrid : public ::testing::TestWithParam<GridCase> {};

TEST_P(AllreduceGrid, ClosedFormAndBitwiseIdenticalOnAllRanks) {
  const Algorithm algorithm = GetParam().algorithm;  // (not a structured binding: lambdas capture these)
  const ReduceOp op = GetParam().op;
  for (int n = 1; n <= 9; ++n) {
    for (std::size_t count : closed_form::allreduce_counts(n)) {
      std::vector<std::vector<float>> results(n);
      auto errors = run_ranks(n, [&](Communicator& comm) {
        std::vector<float> data = closed_form::inputs(comm.rank(), count);
        allreduce(comm, data, {.op = op, .algorithm = algorithm});
        results[comm.rank()] = std::move(data);
      });
      rethrow_first(errors);
      if (const std::size_t i = closed_form::first_mismatch(results[0], op, n); i < count) {
        ASSERT_FLOAT_EQ(results[0][i], closed_form::expected(op, n, i))
            << "n=" << n << " count=" << count << " i=" << i;
      }
      for (int r = 1; r < n; ++r) {
        ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * sizeof(float)))
            << "rank " << r << " differs from rank 0, n=" << n << " count=" << count;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllAlgorithmsAndOps, AllreduceGrid,
    ::testing::Values(
        GridCase{Algorithm::Ring, ReduceOp::Sum}, GridCase{Algorithm::Ring, ReduceOp::Mean},
        GridCase{Algorithm::Ring, ReduceOp::Max}, GridCase{Algorithm::Ring, ReduceOp::Min},
        GridCase{Algorithm::Naive, ReduceOp::Sum}, GridCase{Algorithm::Naive, ReduceOp::Mean},
        GridCase{Algorithm::Naive, ReduceOp::Max}, GridCase{Algorithm::Naive, ReduceOp::Min},
        GridCase{Algorithm::HalvingDoubling, ReduceOp::Sum},
        GridCase{Algorithm::HalvingDoubling, ReduceOp::Mean},
        GridCase{Algorithm::HalvingDoubling, ReduceOp::Max},
        GridCase{Algorithm::HalvingDoubling, ReduceOp::Min}, GridCase{Algorithm::SharedMemory, ReduceOp::Sum},
        GridCase{Algorithm::SharedMemory, ReduceOp::Mean}, GridCase{Algorithm::SharedMemory, ReduceOp::Max},
        GridCase{Algorithm::SharedMemory, ReduceOp::Min}, GridCase{Algorithm::Auto, ReduceOp::Mean}),
    [](const auto& info) {
      return std::string(to_string(info.param.algorithm)) + "_" + to_string(info.param.op);
    });

// (The threads backend checks fingerprints in shared memory: no bytes.)
TEST(Allreduce, SendsTwoPTimesNMinusOneOverNBytesPerRank) {
  for (auto algorithm : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::SharedMemory})
    for (int n : {2, 3, 8}) {
      if (algorithm == Algorithm::HalvingDoubling && n == 3) continue;  // the fold step sends more
      const std::size_t count = 24 * 1000;                              // divisible by every n above
      std::vector<std::uint64_t> sent(n);
      rethrow_first(run_ranks(n, [&](Communicator& comm) {
        std::vector<float> data(count, 1.0f);
        allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = algorithm});
        sent[comm.rank()] = comm.stats().bytes_sent;
      }));
      const std::uint64_t p = count * sizeof(float);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(sent[r], 2 * p * (n - 1) / n) << to_string(algorithm) << " n=" << n << " rank " << r;
      }
    }
}

TEST(Broadcast, EveryRankGetsRootData) {
  for (int n = 1; n <= 9; ++n) {
    for (int root = 0; root < n; ++root) {
      std::vector<std::vector<float>> got(n);
      rethrow_first(run_ranks(n, [&](Communicator& comm) {
        std::vector<float> data = closed_form::broadcast_inputs(comm.rank());
        broadcast(comm, std::span<float>(data), root);
        got[comm.rank()] = data;
      }));
      for (int r = 0; r < n; ++r) EXPECT_EQ(got[r], closed_form::broadcast_expected(root)) << n << root;
    }
  }
}

TEST(Failure, AbortOnOneRankWakesEveryRankWithTheReason) {
  auto errors = run_ranks(4, [](Communicator& comm) {
    std::vector<float> data(1000, 1.0f);
    if (comm.rank() == 2) {
      comm.abort("rank 2: replica failed in backward");
      return;
    }
    allreduce(comm, data, {.op = ReduceOp::Sum});
  });
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CommAborted& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2: replica failed in backward"), std::string::npos);
    }
  }
  EXPECT_FALSE(errors[2]);
}

// "At once": well inside the timeout a later call would wait out if the
// abort were not remembered (half of it, so a loaded machine's scheduling
// cannot fail the test).
TEST(Failure, MissingPeerTimesOutAndLaterCallsFailAtOnce) {
  constexpr auto kTimeout = std::chrono::milliseconds(1000);
  auto errors = run_ranks(
      3,
      [kTimeout](Communicator& comm) {
        std::vector<float> data(10, 1.0f);
        if (comm.rank() == 1) return;  // never joins
        try {
          allreduce(comm, data, {.op = ReduceOp::Sum});
        } catch (const Error&) {
          const auto start = std::chrono::steady_clock::now();
          EXPECT_THROW(allreduce(comm, data, {.op = ReduceOp::Sum}), CommAborted);
          EXPECT_LT(std::chrono::steady_clock::now() - start, kTimeout / 2);
          throw;
        }
      },
      kTimeout);
  ASSERT_TRUE(errors[0]);
  ASSERT_TRUE(errors[2]);
  EXPECT_FALSE(errors[1]);
}

// Max and Min give the same bits whatever order an algorithm combines the
// ranks in: a NaN on one rank wins; of NaNs on every rank, the largest bit
// pattern; +0 beats -0 for Max and loses for Min. std::max would keep the
// first operand of an unordered or equal pair, and ranks would disagree.
TEST(AllreduceMaxMin, NaNsAndSignedZerosGiveTheSameBitsInAnyOrder) {
  const auto bits = [](float f) { return std::bit_cast<std::uint32_t>(f); };
  const auto nan_with = [](std::uint32_t payload) { return std::bit_cast<float>(0x7fc00000u | payload); };
  for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
    for (int n : {2, 3, 5, 8}) {
      for (std::size_t count : {std::size_t{8}, std::size_t{8192}}) {  // shared memory: staged, in place
        std::vector<std::uint32_t> reference;
        for (auto algorithm : {Algorithm::Naive, Algorithm::Ring, Algorithm::HalvingDoubling,
                               Algorithm::SharedMemory, Algorithm::Tree}) {
          if (algorithm == Algorithm::Tree && (n & (n - 1)) != 0) continue;  // powers of two only
          std::vector<std::vector<float>> results(n);
          rethrow_first(run_ranks(n, [&](Communicator& comm) {
            const int r = comm.rank();
            std::vector<float> data(count);
            for (std::size_t i = 0; i < count; i += 4) {
              data[i] = r == 1 ? nan_with(5) : float(r);      // one rank's NaN
              data[i + 1] = r % 2 == 0 ? 0.0f : -0.0f;          // signed zeros
              data[i + 2] = nan_with(std::uint32_t(r) * 3 + 1);  // a NaN on every rank
              data[i + 3] = float((r * 7) % n) - 1.5f;           // ordinary values
            }
            allreduce(comm, data, {.op = op, .algorithm = algorithm});
            results[r] = std::move(data);
          }));
          const std::string where = std::string(to_string(op)) + " " + to_string(algorithm) + " n=" +
                                    std::to_string(n) + " count=" + std::to_string(count);
          std::vector<std::uint32_t> got(count);
          for (std::size_t i = 0; i < count; ++i) got[i] = bits(results[0][i]);
          EXPECT_EQ(got[0], bits(nan_with(5))) << where;
          EXPECT_EQ(got[1], op == ReduceOp::Max ? bits(0.0f) : bits(-0.0f)) << where;
          EXPECT_EQ(got[2], bits(nan_with(std::uint32_t(n - 1) * 3 + 1))) << where;
          EXPECT_EQ(results[0][3], op == ReduceOp::Max ? float(n - 1) - 1.5f : -1.5f) << where;
          for (int r = 1; r < n; ++r)
            EXPECT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * sizeof(float)))
                << where << ": rank " << r << " differs from rank 0";
          if (reference.empty()) reference = got;
          EXPECT_EQ(got, reference) << where << " differs from the naive all-reduce";
        }
      }
    }
  }
}

TEST(Failure, SizeMismatchAbortsTheGroup) {
  // Shared memory at both of its paths: staged (up to 16 KiB) and in place,
  // where each rank writes into the others' buffers (ASan sees an overrun).
  for (auto algorithm : {Algorithm::Naive, Algorithm::Ring, Algorithm::SharedMemory}) {
    for (std::size_t count : {std::size_t{10}, std::size_t{20000}}) {
      auto errors = run_ranks(2, [&](Communicator& comm) {
        // verify = false: the transport's own size check, not the fingerprint, must catch it.
        std::vector<float> data(comm.rank() == 0 ? count : count + count / 2, 1.0f);
        allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = algorithm, .verify = false});
      });
      EXPECT_TRUE(errors[0]) << to_string(algorithm) << " " << count;
      EXPECT_TRUE(errors[1]) << to_string(algorithm) << " " << count;
    }
  }
}

TEST(Failure, SharedMemoryMissingPeerTimesOutNamingTheCollective) {
  auto errors = run_ranks(
      3,
      [](Communicator& comm) {
        std::vector<float> data(10, 1.0f);
        if (comm.rank() == 1) return;
        allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::SharedMemory});
      },
      std::chrono::milliseconds(200));
  int timeouts = 0;
  for (int r : {0, 2}) {
    ASSERT_TRUE(errors[r]);
    try {
      std::rethrow_exception(errors[r]);
    } catch (const TimeoutError& e) {
      ++timeouts;
      EXPECT_NE(
          std::string(e.what()).find("allreduce(sum, float32, 10 elements, seq 0, shared_memory) timed out"),
          std::string::npos)
          << e.what();
      // The rank that never came is named.
      EXPECT_NE(std::string(e.what()).find("waiting for rank 1 (1 of 3 had not arrived)"), std::string::npos)
          << e.what();
    } catch (const CommAborted&) {
    }
  }
  EXPECT_GE(timeouts, 1);
}

}  // namespace
}  // namespace lockstep::comm
