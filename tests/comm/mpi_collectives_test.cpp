// The collective grid of allreduce_test.cpp and scatter_gather_test.cpp, run
// by every rank of `mpirun -np N` over the MPI backend: closed-form results,
// bitwise identical on every rank, for ring, halving-doubling, naive and
// native (MPI_Allreduce) x sum/mean/max/min; reduce-scatter, all-gather,
// broadcast and barrier.
//
// A rank never returns early from a test (EXPECT, not ASSERT, around the
// collectives): the others would wait for it until the timeout.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "closed_form.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "mpi_rank.h"
#include "order_sensitive_inputs.h"

namespace lockstep::comm {
namespace {

using testing::mpi_world;
namespace closed_form = testing::closed_form;

// FNV-1a of the bytes: one number per rank's result, compared across ranks.
std::uint64_t digest(std::span<const float> data) {
  std::uint64_t h = 14695981039346656037ull;
  for (std::byte b : std::as_bytes(data)) h = (h ^ static_cast<std::uint64_t>(b)) * 1099511628211ull;
  return h;
}

// Every rank's digest against rank 0's (sent by broadcast, a plain copy).
void expect_same_on_every_rank(Communicator& comm, std::span<const float> data, const std::string& what) {
  const std::uint64_t mine = digest(data);
  std::uint64_t rank0 = mine;
  broadcast(comm, std::as_writable_bytes(std::span<std::uint64_t>(&rank0, 1)), 0);
  EXPECT_EQ(mine, rank0) << "rank " << comm.rank() << " differs from rank 0: " << what;
}

struct GridCase {
  Algorithm algorithm;
  ReduceOp op;
};

class MpiAllreduceGrid : public ::testing::TestWithParam<GridCase> {};

// The closed form of `algorithm` x `op` at every count of the grid, and the
// same bits on every rank.
void expect_closed_form(Communicator& comm, Algorithm algorithm, ReduceOp op) {
  const int n = comm.size();
  for (std::size_t count : closed_form::allreduce_counts(n)) {
    std::vector<float> data = closed_form::inputs(comm.rank(), count);
    allreduce(comm, data, {.op = op, .algorithm = algorithm});
    std::size_t wrong = count;
    for (std::size_t i = 0; i < count && wrong == count; ++i) {
      // Mean is a sum scaled by 1/N: within a few ulp of the exact quotient.
      const float want = closed_form::expected(op, n, i);
      if (op == ReduceOp::Mean ? std::abs(data[i] - want) > 4e-7f * want : data[i] != want) wrong = i;
    }
    EXPECT_EQ(wrong, count) << "n=" << n << " count=" << count << " first wrong element " << wrong << " = "
                            << (wrong < count ? data[wrong] : 0.0f) << ", want "
                            << (wrong < count ? closed_form::expected(op, n, wrong) : 0.0f);
    expect_same_on_every_rank(comm, data, "count " + std::to_string(count));
  }
}

TEST_P(MpiAllreduceGrid, ClosedFormAndBitwiseIdenticalOnAllRanks) {
  const auto [algorithm, op] = GetParam();
  expect_closed_form(mpi_world(), algorithm, op);
}

INSTANTIATE_TEST_SUITE_P(
    AllAlgorithmsAndOps, MpiAllreduceGrid,
    ::testing::Values(GridCase{Algorithm::Ring, ReduceOp::Sum}, GridCase{Algorithm::Ring, ReduceOp::Mean},
                      GridCase{Algorithm::Ring, ReduceOp::Max}, GridCase{Algorithm::Ring, ReduceOp::Min},
                      GridCase{Algorithm::Naive, ReduceOp::Sum}, GridCase{Algorithm::Naive, ReduceOp::Mean},
                      GridCase{Algorithm::Naive, ReduceOp::Max}, GridCase{Algorithm::Naive, ReduceOp::Min},
                      GridCase{Algorithm::HalvingDoubling, ReduceOp::Sum},
                      GridCase{Algorithm::HalvingDoubling, ReduceOp::Mean},
                      GridCase{Algorithm::HalvingDoubling, ReduceOp::Max},
                      GridCase{Algorithm::HalvingDoubling, ReduceOp::Min},
                      GridCase{Algorithm::Native, ReduceOp::Sum}, GridCase{Algorithm::Native, ReduceOp::Mean},
                      GridCase{Algorithm::Native, ReduceOp::Max}, GridCase{Algorithm::Native, ReduceOp::Min},
                      GridCase{Algorithm::Auto, ReduceOp::Mean}),
    [](const auto& info) {
      return std::string(to_string(info.param.algorithm)) + "_" + to_string(info.param.op);
    });

TEST(MpiAllreduce, RingSendsTwoPTimesNMinusOneOverNBytes) {
  Communicator& comm = mpi_world();
  const int n = comm.size();
  const std::size_t count = 24 * 1000 * 35;  // divisible by 2, 3, 4, 8
  std::vector<float> data(count, 1.0f);
  const auto before = comm.stats().bytes_sent;
  allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring, .verify = false});
  EXPECT_EQ(comm.stats().bytes_sent - before, 2 * count * sizeof(float) * (n - 1) / n);
}

TEST(MpiReduceScatter, EachRankGetsItsChunkOfTheSum) {
  Communicator& comm = mpi_world();
  const int n = comm.size(), r = comm.rank();
  for (std::size_t count : closed_form::reduce_scatter_counts(n)) {
    for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
      std::vector<float> in = closed_form::reduce_scatter_inputs(r, count);
      const std::size_t b = closed_form::chunk_begin(count, n, r), e = closed_form::chunk_end(count, n, r);
      std::vector<float> out(e - b);
      reduce_scatter(comm, in, out, op);
      for (std::size_t i = b; i < e; ++i) {
        EXPECT_FLOAT_EQ(out[i - b], closed_form::reduce_scatter_expected(op, n, i))
            << "n=" << n << " count=" << count << " i=" << i;
      }
    }
  }
}

TEST(MpiAllGather, EveryRankGetsEveryBlockInRankOrder) {
  Communicator& comm = mpi_world();
  const int n = comm.size();
  for (std::size_t block : closed_form::all_gather_blocks()) {
    std::vector<float> in = closed_form::all_gather_inputs(comm.rank(), block);
    std::vector<float> out(block * n, -1.0f);
    all_gather(comm, in, out);
    std::size_t wrong = out.size();
    for (std::size_t i = 0; i < out.size() && wrong == out.size(); ++i)
      if (out[i] != closed_form::all_gather_expected(block, i)) wrong = i;
    EXPECT_EQ(wrong, out.size()) << "block " << block;
  }
}

TEST(MpiBroadcast, EveryRankGetsRootData) {
  Communicator& comm = mpi_world();
  for (int root = 0; root < comm.size(); ++root) {
    std::vector<float> data = closed_form::broadcast_inputs(comm.rank());
    broadcast(comm, std::span<float>(data), root);
    EXPECT_EQ(data, closed_form::broadcast_expected(root)) << "root " << root;
  }
}

TEST(MpiBarrier, EveryRankPassesManyBarriers) {
  Communicator& comm = mpi_world();
  // Also walks the sequence number past many collectives on one communicator.
  for (int i = 0; i < 200; ++i) barrier(comm);
  std::vector<float> data(100, 1.0f);
  allreduce(comm, data, {.op = ReduceOp::Sum});
  EXPECT_EQ(data, std::vector<float>(100, float(comm.size())));
}

// Nodes over MPI (Note [Nodes over MPI] in mpi_communicator.cpp).
// mpi_nodes_test.sh gives every G consecutive ranks their own host name (each
// rank in its own UTS namespace) and says G in LOCKSTEP_TEST_PER_NODE, as if
// they ran on N/G machines; without it, every rank runs on this one host.
int ranks_per_node(const Communicator& comm) {
  const char* g = std::getenv("LOCKSTEP_TEST_PER_NODE");
  const int per_node = g != nullptr ? std::atoi(g) : 0;
  return per_node > 0 ? per_node : comm.size();
}

TEST(MpiNodes, FollowTheProcessorNames) {
  Communicator& comm = mpi_world();
  const int g = ranks_per_node(comm);
  std::vector<int> want(static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) want[static_cast<std::size_t>(r)] = r / g;
  EXPECT_EQ(comm.nodes(), want) << "rank " << comm.rank();
}

TEST(MpiNodes, HierarchicalMatchesTheClosedFormAndAutoChoosesIt) {
  Communicator& comm = mpi_world();
  const int g = ranks_per_node(comm);
  if (g == comm.size()) GTEST_SKIP() << "one node (run by mpi_nodes_test.sh with several)";
  for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
    expect_closed_form(comm, Algorithm::Hierarchical, op);
  }
  // Auto above 64 KiB on even nodes: the hierarchical all-reduce's bits, which
  // differ from the flat ring's on inputs whose sum depends on the order.
  const std::size_t count = std::size_t{1} << 18;  // 1 MiB
  const std::vector<float> inputs = testing::order_sensitive_inputs(7, comm.rank(), count);
  auto reduced = [&](Algorithm algorithm) {
    std::vector<float> data = inputs;
    allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = algorithm});
    return data;
  };
  const auto hierarchical = reduced(Algorithm::Hierarchical), ring = reduced(Algorithm::Ring);
  EXPECT_NE(hierarchical, ring) << "the inputs do not tell the two orders apart";
  EXPECT_EQ(reduced(Algorithm::Auto), hierarchical) << "rank " << comm.rank();
}

}  // namespace
}  // namespace lockstep::comm
