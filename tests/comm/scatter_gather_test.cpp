// Reduce-scatter and all-gather against closed forms, over the grid of world
// sizes and counts.
#include <gtest/gtest.h>

#include "closed_form.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "run_ranks.h"

namespace lockstep::comm {
namespace {

using testing::rethrow_first;
using testing::run_ranks;
namespace closed_form = testing::closed_form;

TEST(ReduceScatter, EachRankGetsItsChunkOfTheSum) {
  for (int n = 1; n <= 9; ++n) {
    for (std::size_t count : closed_form::reduce_scatter_counts(n)) {
      for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
        rethrow_first(run_ranks(n, [&](Communicator& comm) {
          const int r = comm.rank();
          std::vector<float> in = closed_form::reduce_scatter_inputs(r, count);
          const std::size_t b = closed_form::chunk_begin(count, n, r),
                            e = closed_form::chunk_end(count, n, r);
          std::vector<float> out(e - b);
          reduce_scatter(comm, in, out, op);
          for (std::size_t i = b; i < e; ++i) {
            ASSERT_FLOAT_EQ(out[i - b], closed_form::reduce_scatter_expected(op, n, i))
                << "n=" << n << " count=" << count << " i=" << i;
          }
        }));
      }
    }
  }
}

TEST(AllGather, EveryRankGetsEveryBlockInRankOrder) {
  for (int n = 1; n <= 9; ++n) {
    for (std::size_t block : closed_form::all_gather_blocks()) {
      rethrow_first(run_ranks(n, [&](Communicator& comm) {
        std::vector<float> in = closed_form::all_gather_inputs(comm.rank(), block);
        std::vector<float> out(block * n, -1.0f);
        all_gather(comm, in, out);
        for (std::size_t i = 0; i < out.size(); ++i)
          ASSERT_EQ(out[i], closed_form::all_gather_expected(block, i)) << n << " " << i;
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
