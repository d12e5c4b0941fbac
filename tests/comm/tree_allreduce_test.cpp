// The tree all-reduce: every element summed in the balanced binary tree over
// rank index, the same bits as one rank summing the inputs pairwise in order
// (Note [Tree order], src/comm/tree_allreduce.cpp).
#include <gtest/gtest.h>

#include <cstring>

#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "order_sensitive_inputs.h"
#include "run_ranks.h"

namespace lockstep::comm {
namespace {

using testing::rethrow_first;
using testing::run_ranks;

std::vector<float> inputs(int rank, std::size_t count) {
  return testing::order_sensitive_inputs(1234, rank, count);
}

// The naive sibling of the tree: split at the largest power of two below the
// count, so ((v0 + v1) + (v2 + v3)) + ... for a power of two and
// ((v0 + v1) + v2) for three (the shared-memory path's one-pass sums, up to
// 16 ranks, and its tree_reduce beyond).
float split_tree_sum(std::span<const float> v) {
  if (v.size() == 1) return v[0];
  std::size_t half = 1;
  while (half * 2 < v.size()) half *= 2;
  return split_tree_sum(v.first(half)) + split_tree_sum(v.subspan(half));
}

// Every rank's result of one all-reduce of inputs(rank, count).
std::vector<std::vector<float>> reduce_on_ranks(int n, std::size_t count, ReduceOp op, Algorithm algorithm) {
  std::vector<std::vector<float>> results(n);
  rethrow_first(run_ranks(n, [&](Communicator& comm) {
    auto data = inputs(comm.rank(), count);
    allreduce(comm, data, {.op = op, .algorithm = algorithm});
    results[comm.rank()] = std::move(data);
  }));
  return results;
}

// Element i of every rank's input (`in[r]` = inputs(r, count)), and their sum in rank order.
struct Column {
  std::vector<float> values;
  float sequential = 0;
};

Column column_at(const std::vector<std::vector<float>>& in, std::size_t i) {
  Column c;
  for (const auto& rank_input : in) {
    c.values.push_back(rank_input[i]);
    c.sequential += rank_input[i];
  }
  return c;
}

std::vector<std::vector<float>> all_inputs(int n, std::size_t count) {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < n; ++r) in.push_back(inputs(r, count));
  return in;
}

// The shared-memory path sums in the same tree (and so does its staged
// path for small buffers): the fast in-process all-reduce is tree-ordered too.
class TreeOrder : public ::testing::TestWithParam<Algorithm> {};

TEST_P(TreeOrder, EqualsTheBalancedTreeOverRanksBitForBit) {
  const Algorithm algorithm = GetParam();
  for (int n : {1, 2, 4, 8}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t(n), std::size_t{1001}, std::size_t{1} << 16}) {
      const auto results = reduce_on_ranks(n, count, ReduceOp::Sum, algorithm);
      const auto in = all_inputs(n, count);
      std::size_t differs_from_sequential = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const Column column = column_at(in, i);
        const float want = split_tree_sum(column.values);
        ASSERT_EQ(std::memcmp(&results[0][i], &want, 4), 0) << "n=" << n << " i=" << i;
        differs_from_sequential += column.sequential != want;
      }
      for (int r = 1; r < n; ++r)
        ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * 4)) << "rank " << r;
      if (n == 8 && count > 1000) {
        EXPECT_GT(differs_from_sequential, 0u) << "the inputs cannot tell the orders apart";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TreeAndSharedMemory, TreeOrder,
                         ::testing::Values(Algorithm::Tree, Algorithm::SharedMemory),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(SharedMemoryAllreduce, AnyRankCountSumsInTheSplitTreeBitForBit) {
  // 1001: the staged path (under 16 KiB); 2^14 + 3: the chunked path, with ragged chunks.
  for (const std::size_t count : {std::size_t{1001}, (std::size_t{1} << 14) + 3}) {
    for (int n = 2; n <= 17; ++n) {
      for (auto op : {ReduceOp::Sum, ReduceOp::Mean}) {
        const auto results = reduce_on_ranks(n, count, op, Algorithm::SharedMemory);
        const auto in = all_inputs(n, count);
        const float scale = 1.0f / static_cast<float>(n);
        std::size_t differs_from_sequential = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const Column column = column_at(in, i);
          float want = split_tree_sum(column.values);
          differs_from_sequential += column.sequential != want;
          if (op == ReduceOp::Mean) want *= scale;
          ASSERT_EQ(std::memcmp(&results[0][i], &want, 4), 0)
              << "n=" << n << " count=" << count << " " << to_string(op) << " i=" << i;
        }
        for (int r = 1; r < n; ++r)
          ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * 4)) << "rank " << r;
        // For 3 ranks the split tree is the sequential sum; from 4 on the inputs must tell them apart.
        if (n >= 4) {
          EXPECT_GT(differs_from_sequential, 0u) << "n=" << n << ": the inputs cannot tell the orders apart";
        }
      }
    }
  }
}

TEST(TreeAllreduce, AllOpsAndBytesOnTheWire) {
  const std::size_t count = 8 * 1000;
  for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
    std::vector<std::uint64_t> sent(8);
    std::vector<float> first(count);
    rethrow_first(run_ranks(8, [&](Communicator& comm) {
      std::vector<float> data(count, float(comm.rank() + 1));
      allreduce(comm, data, {.op = op, .algorithm = Algorithm::Tree});
      sent[comm.rank()] = comm.stats().bytes_sent;
      if (comm.rank() == 0) first = data;
    }));
    const float want = op == ReduceOp::Sum ? 36 : op == ReduceOp::Mean ? 4.5f : op == ReduceOp::Max ? 8 : 1;
    for (float v : first) ASSERT_EQ(v, want) << to_string(op);
    for (auto s : sent) EXPECT_EQ(s, 2 * count * 4 * 7 / 8) << to_string(op);
  }
}

TEST(TreeAllreduce, RefusesANonPowerOfTwoWorld) {
  auto errors = run_ranks(3, [&](Communicator& comm) {
    std::vector<float> data(10, 1.0f);
    allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::Tree});
  });
  // Every rank refuses it itself, before the group's abort is read.
  for (const auto& error : errors) {
    ASSERT_TRUE(error);
    try {
      std::rethrow_exception(error);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("power-of-two number of ranks, not 3"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep::comm
