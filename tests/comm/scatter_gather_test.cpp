// Reduce-scatter and all-gather against closed forms, over the grid of world
// sizes and counts.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>

#include "closed_form.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "order_sensitive_inputs.h"
#include "p2p_only.h"
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

// Element i of rank r's block in the gather and scatter tests: distinct for
// every rank and position, so a block out of order, or shifted, shows.
float block_value(int r, std::size_t i) { return float(r * 100000 + int(i)); }

// Gather to a root, from every root: the root holds every block in rank
// order; the others' output is left alone, and each sends its block once,
// the root nothing (the threads backend compares fingerprints in shared
// memory, so the bytes sent are the data alone).
TEST(Gather, TheRootGetsEveryBlockInRankOrder) {
  for (int n = 1; n <= 9; ++n) {
    for (int root = 0; root < n; ++root) {
      for (std::size_t block : closed_form::all_gather_blocks()) {
        rethrow_first(run_ranks(n, [&](Communicator& comm) {
          std::vector<float> in(block);
          for (std::size_t i = 0; i < block; ++i) in[i] = block_value(comm.rank(), i);
          std::vector<float> out(block * n, -1.0f);
          const auto sent = comm.stats().bytes_sent;
          gather(comm, in, out, root);
          for (std::size_t i = 0; i < out.size(); ++i) {  // (none when block is 0)
            ASSERT_EQ(out[i], comm.rank() == root ? block_value(int(i / block), i % block) : -1.0f)
                << "n=" << n << " root=" << root << " rank=" << comm.rank() << " i=" << i;
          }
          EXPECT_EQ(comm.stats().bytes_sent - sent, comm.rank() == root ? 0 : block * sizeof(float));
        }));
      }
    }
  }
  // A root output of the wrong size is refused, and no rank is left waiting.
  const auto errors = run_ranks(3, [](Communicator& comm) {
    std::vector<float> in(4), out(comm.rank() == 0 ? 11 : 0);
    gather(comm, in, out, 0);
  });
  for (const auto& e : errors) EXPECT_TRUE(e != nullptr);
}

// Scatter from every root: each rank gets its own block, the root's input
// is not changed, and only the root sends data, each other rank's block once.
TEST(Scatter, EachRankGetsItsBlock) {
  for (int n = 1; n <= 9; ++n) {
    for (int root = 0; root < n; ++root) {
      for (std::size_t block : closed_form::all_gather_blocks()) {
        rethrow_first(run_ranks(n, [&](Communicator& comm) {
          std::vector<float> in;
          if (comm.rank() == root)
            for (int r = 0; r < n; ++r)
              for (std::size_t i = 0; i < block; ++i) in.push_back(block_value(r, i));
          const std::vector<float> before = in;
          std::vector<float> out(block, -1.0f);
          const auto sent = comm.stats().bytes_sent;
          scatter(comm, in, out, root);
          for (std::size_t i = 0; i < block; ++i)
            ASSERT_EQ(out[i], block_value(comm.rank(), i)) << "n=" << n << " root=" << root << " i=" << i;
          EXPECT_EQ(in, before) << "the root's input changed";
          EXPECT_EQ(comm.stats().bytes_sent - sent, comm.rank() == root ? (n - 1) * block * sizeof(float) : 0);
        }));
      }
    }
  }
  const auto errors = run_ranks(3, [](Communicator& comm) {
    std::vector<float> in(comm.rank() == 1 ? 5 : 0), out(2);
    scatter(comm, in, out, 1);
  });
  for (const auto& e : errors) EXPECT_TRUE(e != nullptr);
}

// The in-place halves (ZeRO-1), on both paths: the threads backend's shared
// memory, and the ring over point-to-point messages only.
struct InPlacePath {
  const char* name;
  bool ring;
};
constexpr InPlacePath kInPlacePaths[] = {{"shared memory", false}, {"ring", true}};

void run_in_place(int n, bool ring, const std::function<void(Communicator&)>& body) {
  rethrow_first(run_ranks(n, [&](Communicator& comm) {
    if (!ring) return body(comm);
    testing::PointToPointOnly p2p(comm);
    body(p2p);
  }));
}

TEST(ReduceScatterInPlace, EachRankOwnsTheNextChunkReduced) {
  for (const auto& path : kInPlacePaths) {
    for (int n = 1; n <= 9; ++n) {
      for (std::size_t count : closed_form::reduce_scatter_counts(n)) {
        for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
          run_in_place(n, path.ring, [&](Communicator& comm) {
            std::vector<float> data = closed_form::reduce_scatter_inputs(comm.rank(), count);
            reduce_scatter_in_place(comm, data, {.op = op});
            const auto [b, e] = shard_range(count, comm.rank(), n);
            ASSERT_EQ(b, closed_form::chunk_begin(count, n, (comm.rank() + 1) % n));
            for (std::size_t i = b; i < e; ++i) {
              ASSERT_FLOAT_EQ(data[i], closed_form::reduce_scatter_expected(op, n, i))
                  << path.name << " n=" << n << " count=" << count << " i=" << i;
            }
          });
        }
      }
    }
  }
}

TEST(AllGatherInPlace, EveryChunkComesFromItsOwner) {
  for (const auto& path : kInPlacePaths) {
    for (int n = 1; n <= 9; ++n) {
      for (std::size_t count : closed_form::reduce_scatter_counts(n)) {
        run_in_place(n, path.ring, [&](Communicator& comm) {
          // Rank r's own chunk holds 10 r + 1, everything else garbage (-r).
          std::vector<float> data(count, -float(comm.rank()));
          const auto [b, e] = shard_range(count, comm.rank(), n);
          std::fill(data.begin() + b, data.begin() + e, float(10 * comm.rank() + 1));
          all_gather_in_place(comm, data);
          for (int owner = 0; owner < n; ++owner) {
            const auto [ob, oe] = shard_range(count, owner, n);
            for (std::size_t i = ob; i < oe; ++i)
              ASSERT_EQ(data[i], float(10 * owner + 1)) << path.name << " n=" << n << " count=" << count << " i=" << i;
          }
        });
      }
    }
  }
}

// Half and half make a whole: the reduced chunks are the same bits as the
// same path's all-reduce (so a sharded step updates from the same gradient),
// and the bytes sent add up to the all-reduce's over the group (per rank
// they differ with uneven chunks on the shared-memory path: its all-reduce's
// rank r reduces chunk r, its reduce-scatter's chunk r+1).
TEST(ScatterGatherInPlace, TheHalvesGiveTheAllReducesBitsAndBytes) {
  const std::size_t count = 300001;  // past the shared-memory path's staged size; uneven chunks for 2, 3 and 8
  for (const auto& path : kInPlacePaths) {
    for (int n : {2, 3, 8}) {
      std::atomic<std::uint64_t> allreduce_bytes{0}, halves_bytes{0};
      run_in_place(n, path.ring, [&](Communicator& comm) {
        const auto input = testing::order_sensitive_inputs(7, comm.rank(), count);
        std::vector<float> whole = input, halves = input;
        const auto before = comm.stats().bytes_sent;
        // Without the fingerprint exchange, which the two halves make twice.
        allreduce(comm, whole,
                  {.op = ReduceOp::Mean, .algorithm = path.ring ? Algorithm::Ring : Algorithm::Auto, .verify = false});
        const auto middle = comm.stats().bytes_sent;
        reduce_scatter_in_place(comm, halves, {.op = ReduceOp::Mean, .verify = false});
        all_gather_in_place(comm, halves, {.verify = false});
        allreduce_bytes += middle - before;
        halves_bytes += comm.stats().bytes_sent - middle;
        ASSERT_EQ(0, std::memcmp(whole.data(), halves.data(), count * sizeof(float))) << path.name << " n=" << n;
      });
      EXPECT_EQ(halves_bytes.load(), allreduce_bytes.load()) << path.name << " n=" << n;
      EXPECT_GT(halves_bytes.load(), 0u);
    }
  }
}

TEST(ScatterGatherInPlace, OtherAlgorithmsAreRefusedOnEveryRank) {
  auto errors = run_ranks(3, [](Communicator& comm) {
    std::vector<float> data(30);
    reduce_scatter_in_place(comm, data, {.algorithm = Algorithm::HalvingDoubling});
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ring or shared memory"), std::string::npos) << e.what();
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

// A rank outside the group, or a group of none, has no shard (a world size
// of 0 divided by zero and crashed the process; rank 5 of 2 was given rank
// 0's range).
TEST(ShardRange, RanksOutsideTheGroupAreRefused) {
  EXPECT_EQ(shard_range(10, 1, 2), (std::pair<std::size_t, std::size_t>{0, 5}));
  EXPECT_EQ(shard_chunk(0, 1), 0);
  EXPECT_THROW(shard_range(10, 0, 0), InvalidArgument);
  EXPECT_THROW(shard_range(10, 5, 2), InvalidArgument);
  EXPECT_THROW(shard_chunk(-1, 3), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::comm
