// Reduce-scatter and all-gather against closed forms, over the grid of world
// sizes and counts.
#include <gtest/gtest.h>

#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "run_ranks.h"

namespace lockstep::comm {
namespace {

using testing::rethrow_first;
using testing::run_ranks;

TEST(ReduceScatter, EachRankGetsItsChunkOfTheSum) {
  for (int n = 1; n <= 9; ++n) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t(n - 1), std::size_t(n),
                              std::size_t(n + 1), std::size_t{1000}}) {
      for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
        rethrow_first(run_ranks(n, [&](Communicator& comm) {
          const int r = comm.rank();
          std::vector<float> in(count);
          for (std::size_t i = 0; i < count; ++i) in[i] = float((r + 1) * (i % 5 + 1));
          const std::size_t b = count * r / n, e = count * (r + 1) / n;
          std::vector<float> out(e - b);
          reduce_scatter(comm, in, out, op);
          for (std::size_t i = b; i < e; ++i) {
            const float base = float(i % 5 + 1);
            const float want = op == ReduceOp::Max   ? base * n
                               : op == ReduceOp::Sum ? base * n * (n + 1) / 2
                                                     : base * (n + 1) / 2.0f;
            ASSERT_FLOAT_EQ(out[i - b], want) << "n=" << n << " count=" << count << " i=" << i;
          }
        }));
      }
    }
  }
}

TEST(AllGather, EveryRankGetsEveryBlockInRankOrder) {
  for (int n = 1; n <= 9; ++n) {
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      rethrow_first(run_ranks(n, [&](Communicator& comm) {
        std::vector<float> in(block, float(comm.rank() * 10));
        std::vector<float> out(block * n, -1.0f);
        all_gather(comm, in, out);
        for (std::size_t i = 0; i < out.size(); ++i)
          ASSERT_EQ(out[i], float((i / block) * 10)) << n << " " << i;
      }));
    }
  }
}

TEST(ScatterGather, AnArgumentErrorOnOneRankStopsEveryRankAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks(
      3,
      [](Communicator& comm) {
        std::vector<float> in(9), out(comm.rank() == 1 ? 4 : 3);
        reduce_scatter(comm, in, out, ReduceOp::Sum);
      },
      std::chrono::seconds(10));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5))
      << "others waited for a timeout";
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(errors[r]) << "rank " << r;
}

TEST(ScatterGather, WrongOutputSizesAreRefused) {
  auto errors = run_ranks(2, [](Communicator& comm) {
    std::vector<float> in(10), out(3);
    EXPECT_THROW(reduce_scatter(comm, in, out, ReduceOp::Sum), InvalidArgument);
    EXPECT_THROW(all_gather(comm, in, out), InvalidArgument);
  });
  rethrow_first(errors);
}

}  // namespace
}  // namespace lockstep::comm
