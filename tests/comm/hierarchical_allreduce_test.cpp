// The hierarchical all-reduce (a ring inside each node, a ring across nodes):
// the closed-form results on every layout, the naive reference on inputs
// whose order matters, the bytes that cross node boundaries, and when Auto
// chooses it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "closed_form.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "order_sensitive_inputs.h"
#include "run_ranks.h"

namespace lockstep::comm {
namespace {

using testing::rethrow_first;
using testing::run_group;

std::vector<std::unique_ptr<Communicator>> group(int n, int per_node) {
  return make_thread_group({.world_size = n, .timeout = std::chrono::seconds(10), .ranks_per_node = per_node});
}

// A communicator that counts the bytes each rank sends to ranks on other
// nodes, and has no native all-reduce (as over a network), so Auto chooses
// among the point-to-point algorithms.
class CrossNodeCounter final : public Communicator {
 public:
  CrossNodeCounter(std::unique_ptr<Communicator> inner, std::shared_ptr<std::atomic<std::uint64_t>> cross)
      : inner_(std::move(inner)), cross_(std::move(cross)) {
    set_timeout(inner_->timeout());
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<Work> post_send(int peer, std::uint64_t tag, std::span<const std::byte> data) override {
    const auto nodes = inner_->nodes();
    if (!nodes.empty() && nodes[peer] != nodes[rank()]) *cross_ += data.size();
    return inner_->post_send(peer, tag, data);
  }
  std::unique_ptr<Work> post_recv(int peer, std::uint64_t tag, std::span<std::byte> data) override {
    return inner_->post_recv(peer, tag, data);
  }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  std::string abort_reason() const override { return inner_->abort_reason(); }
  CommStats stats() const override { return inner_->stats(); }
  std::vector<int> nodes() const override { return inner_->nodes(); }

 private:
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<std::atomic<std::uint64_t>> cross_;
};

std::vector<std::unique_ptr<Communicator>> counted(int n, int per_node,
                                                   std::shared_ptr<std::atomic<std::uint64_t>> cross) {
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& c : group(n, per_node)) out.push_back(std::make_unique<CrossNodeCounter>(std::move(c), cross));
  return out;
}

TEST(Hierarchical, ClosedFormOnEveryLayout) {
  // (ranks, ranks per node): several nodes of several ranks, one rank per
  // node (only the cross-node ring), one node (only the node's ring).
  for (auto [n, g] : {std::pair{4, 2}, {6, 2}, {6, 3}, {8, 2}, {8, 4}, {3, 1}, {4, 4}}) {
    for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
      for (std::size_t count : testing::closed_form::allreduce_counts(n)) {
        if (count > 100000) continue;  // the grid's 1 Mi elements: the ring tests cover those
        std::vector<std::vector<float>> results(n);
        rethrow_first(run_group(group(n, g), [&](Communicator& comm) {
          auto data = testing::closed_form::inputs(comm.rank(), count);
          allreduce(comm, data, {.op = op, .algorithm = Algorithm::Hierarchical});
          results[comm.rank()] = std::move(data);
        }));
        if (const std::size_t i = testing::closed_form::first_mismatch(results[0], op, n); i < count) {
          ASSERT_FLOAT_EQ(results[0][i], testing::closed_form::expected(op, n, i))
              << n << " ranks, " << g << " per node, " << to_string(op) << ", count " << count << ", i " << i;
        }
        for (int r = 1; r < n; ++r)
          ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * sizeof(float)))
              << "rank " << r << " differs from rank 0: " << n << " ranks, " << g << " per node";
      }
    }
  }
}

TEST(Hierarchical, PiecesOverlapTheNodeExchangesWithTheCrossNodeRing) {
  // Over 16 MiB: three pieces of ~5.3 MiB go through the steps, their node
  // exchanges posted ahead (two and three ranks per node).
  const std::size_t count = ((std::size_t{16} << 20) + 4096) / sizeof(float) + 3;
  for (auto [n, g] : {std::pair{4, 2}, {6, 3}}) {
    std::vector<std::vector<float>> results(n);
    rethrow_first(run_group(group(n, g), [&](Communicator& comm) {
      auto data = testing::closed_form::inputs(comm.rank(), count);
      allreduce(comm, data, {.op = ReduceOp::Mean, .algorithm = Algorithm::Hierarchical});
      results[comm.rank()] = std::move(data);
    }));
    if (const std::size_t i = testing::closed_form::first_mismatch(results[0], ReduceOp::Mean, n); i < count) {
      ASSERT_FLOAT_EQ(results[0][i], testing::closed_form::expected(ReduceOp::Mean, n, i)) << "i " << i;
    }
    for (int r = 1; r < n; ++r)
      ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * sizeof(float))) << "rank " << r;
  }
}

TEST(Hierarchical, AgreesWithTheNaiveReference) {
  // Inputs whose sum depends on the order: the hierarchical and the naive
  // all-reduce add in different orders, so they agree to rounding, not bits.
  const int n = 8, g = 2;
  const std::size_t count = 100003;
  for (auto op : {ReduceOp::Sum, ReduceOp::Mean}) {
    std::vector<std::vector<float>> fast(n), naive(n);
    rethrow_first(run_group(group(n, g), [&](Communicator& comm) {
      auto a = testing::order_sensitive_inputs(5, comm.rank(), count);
      auto b = a;
      allreduce(comm, a, {.op = op, .algorithm = Algorithm::Hierarchical});
      allreduce(comm, b, {.op = op, .algorithm = Algorithm::Naive});
      fast[comm.rank()] = std::move(a);
      naive[comm.rank()] = std::move(b);
    }));
    // Two float sums of n terms differ by at most ~2(n-1) eps x sum |x|.
    std::vector<std::vector<float>> in;
    for (int r = 0; r < n; ++r) in.push_back(testing::order_sensitive_inputs(5, r, count));
    double worst = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double magnitude = 0;
      for (int r = 0; r < n; ++r) magnitude += std::fabs(double(in[r][i]));
      if (op == ReduceOp::Mean) magnitude /= n;
      worst = std::max(worst, std::fabs(double(fast[0][i]) - double(naive[0][i])) / magnitude);
    }
    EXPECT_LT(worst, 2 * (n - 1) * 0x1p-24) << to_string(op);
    EXPECT_GT(worst, 0) << "the orders differ, so some element should round differently";
  }
}

TEST(Hierarchical, FewerBytesCrossNodesThanTheRing) {
  // 4 nodes of 2 ranks, P bytes: the flat ring sends 2P(N-1)/N = 1.75P out
  // of each node (one message per round crosses each node boundary); the
  // hierarchical all-reduce sends 2P(M-1)/M = 1.5P.
  const int n = 8, g = 2, m = 4;
  const std::size_t count = 8 * 1000;  // divides evenly: exact byte counts
  const double p = double(count * sizeof(float));
  for (const auto& [algorithm_, per_node_bytes] :
       {std::pair{Algorithm::Ring, 2 * p * (n - 1) / n}, {Algorithm::Hierarchical, 2 * p * (m - 1) / m}}) {
    const Algorithm algorithm = algorithm_;  // a lambda captures it (clang 14 cannot capture a binding)
    auto cross = std::make_shared<std::atomic<std::uint64_t>>(0);
    rethrow_first(run_group(counted(n, g, cross), [&](Communicator& comm) {
      auto data = testing::closed_form::inputs(comm.rank(), count);
      allreduce(comm, data, {.algorithm = algorithm, .verify = false});
    }));
    EXPECT_EQ(double(cross->load()), m * per_node_bytes) << to_string(algorithm);
  }
}

TEST(Hierarchical, AutoChoosesItForLargeBuffersAcrossEvenNodes) {
  const std::size_t large = 1 << 16, small = 64;  // floats: 256 KiB and 256 bytes
  auto cross_bytes = [](int n, int g, std::size_t count, Algorithm algorithm) {
    auto cross = std::make_shared<std::atomic<std::uint64_t>>(0);
    rethrow_first(run_group(counted(n, g, cross), [&](Communicator& comm) {
      auto data = testing::closed_form::inputs(comm.rank(), count);
      allreduce(comm, data, {.algorithm = algorithm, .verify = false});
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(data[i], testing::closed_form::expected(ReduceOp::Sum, n, i));
    }));
    return cross->load();
  };
  // 4 nodes of 2: Auto is the hierarchical all-reduce above 64 KiB,
  // halving-doubling below.
  EXPECT_EQ(cross_bytes(8, 2, large, Algorithm::Auto), cross_bytes(8, 2, large, Algorithm::Hierarchical));
  EXPECT_EQ(cross_bytes(8, 2, small, Algorithm::Auto), cross_bytes(8, 2, small, Algorithm::HalvingDoubling));
  // Uneven nodes (3, 3, 2) or no node information: the flat ring.
  EXPECT_EQ(cross_bytes(8, 3, large, Algorithm::Auto), cross_bytes(8, 3, large, Algorithm::Ring));
  EXPECT_EQ(cross_bytes(8, 8, large, Algorithm::Auto), 0u);  // one node: nothing crosses
  // algorithm_for says so beforehand (what bench allreduce reports it ran).
  const auto chosen = [](int n, int g, std::size_t count, Algorithm requested) {
    auto cross = std::make_shared<std::atomic<std::uint64_t>>(0);
    return algorithm_for(*counted(n, g, cross).front(), count * sizeof(float), requested);
  };
  EXPECT_EQ(chosen(8, 2, large, Algorithm::Auto), Algorithm::Hierarchical);
  EXPECT_EQ(chosen(8, 2, small, Algorithm::Auto), Algorithm::HalvingDoubling);
  EXPECT_EQ(chosen(8, 3, large, Algorithm::Auto), Algorithm::Ring);
  EXPECT_EQ(chosen(8, 2, large, Algorithm::Naive), Algorithm::Naive);
  // Where the backend shares memory, its own path at any size.
  EXPECT_EQ(algorithm_for(*group(8, 2).front(), 64, Algorithm::Auto), Algorithm::SharedMemory);
}

TEST(Hierarchical, RefusedWithoutAnEvenNodeLayout) {
  for (int g : {0, 3}) {  // no node information; nodes of 3, 3 and 2
    const auto errors = run_group(group(8, g), [&](Communicator& comm) {
      std::vector<float> data(1000, 1.0f);
      allreduce(comm, data, {.algorithm = Algorithm::Hierarchical});
    });
    for (const auto& e : errors) {
      ASSERT_TRUE(e) << "ranks per node " << g;
      try {
        std::rethrow_exception(e);
      } catch (const InvalidArgument& ex) {
        EXPECT_NE(std::string(ex.what()).find("hierarchical all-reduce needs to know which ranks share a node"),
                  std::string::npos)
            << ex.what();
      } catch (const std::exception& ex) {
        ADD_FAILURE() << "ranks per node " << g << ": " << ex.what();
      }
    }
  }
}

TEST(Hierarchical, ThreadGroupNodes) {
  EXPECT_TRUE(group(4, 0)[0]->nodes().empty());
  EXPECT_EQ(group(5, 2)[3]->nodes(), (std::vector<int>{0, 0, 1, 1, 2}));
  EXPECT_THROW(group(4, -1), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::comm
