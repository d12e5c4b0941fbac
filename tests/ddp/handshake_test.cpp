// The digest, its comparison across ranks, and the start-up handshake.
#include "lockstep/ddp/handshake.h"

#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <set>

#include "comm/run_ranks.h"
#include "lockstep/ddp/replica_digest.h"
#include "lockstep/error.h"

namespace lockstep::ddp {
namespace {

using testing::run_ranks;

// Every single flipped bit changes the digest, at every length around the
// 32-byte block and 8-byte word boundaries (Note [Digest rounds]).
TEST(Digest, EveryFlippedBitChangesIt) {
  for (std::size_t n : {0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100}) {
    std::vector<std::byte> bytes(n);
    for (std::size_t i = 0; i < n; ++i) bytes[i] = std::byte((i * 131 + 7) & 0xff);
    const auto base = digest(bytes);
    EXPECT_EQ(base, digest(bytes)) << "not deterministic";
    std::set<std::uint64_t> seen{base};
    for (std::size_t bit = 0; bit < 8 * n; ++bit) {
      bytes[bit / 8] ^= std::byte(1u << (bit % 8));
      seen.insert(digest(bytes));
      bytes[bit / 8] ^= std::byte(1u << (bit % 8));
    }
    EXPECT_EQ(seen.size(), 8 * n + 1) << n << " bytes: some flips collided";
  }
  // A zero-padded tail is not the same input as real zeros.
  std::vector<std::byte> three(3), four(4);
  EXPECT_NE(digest(three), digest(four));
}

// Two sign flips in the same lane must not cancel (they would with a plain
// xor-multiply round, where a top-bit difference never moves).
TEST(Digest, TwoSignFlipsDoNotCancel) {
  std::vector<float> v(64, 0.5f);
  const auto base = digest(v);
  v[1] = -v[1];
  v[9] = -v[9];  // 32 bytes later: the same lane, the same bit
  EXPECT_NE(digest(v), base);
}

// World sizes 1..9; one rank's field differs; every rank gets the same
// answer naming that rank, and the majority as the others.
TEST(CompareAcrossRanks, NamesTheOddRankOnEveryRank) {
  for (int n = 1; n <= 9; ++n) {
    for (int odd = 0; odd < n; ++odd) {
      std::mutex mu;
      std::vector<std::vector<DigestMismatch>> seen(n);
      auto errors = run_ranks(n, [&](comm::Communicator& comm) {
        std::vector<std::uint64_t> d = {11, 0xfedcba9876543210ull, 33};
        if (comm.rank() == odd && n > 2) d[1] ^= 1ull << 63;
        auto m = compare_across_ranks(comm, d);
        std::lock_guard lock(mu);
        seen[comm.rank()] = std::move(m);
      });
      testing::rethrow_first(errors);
      for (int r = 0; r < n; ++r) {
        if (n <= 2) {
          EXPECT_TRUE(seen[r].empty());
          continue;
        }
        ASSERT_EQ(seen[r].size(), 1u) << "n=" << n << " rank " << r;
        EXPECT_EQ(seen[r][0].field, 1u);
        EXPECT_EQ(seen[r][0].ranks, std::vector<int>{odd});
        EXPECT_EQ(seen[r][0].majority.size(), std::size_t(n - 1));
        EXPECT_EQ(healthy_rank(seen[r], n), odd == 0 ? 1 : 0);
      }
    }
  }
}

// With two replicas, or a 2-2 split, there is no majority: the result says
// it is a tie, and healthy_rank names no rank to repair from (it named
// rank 0, whichever replica had changed).
TEST(CompareAcrossRanks, ATieIsMarkedAndHasNoHealthyRank) {
  auto errors = run_ranks(2, [&](comm::Communicator& comm) {
    const std::uint64_t d = comm.rank() == 0 ? 1 : 2;
    auto m = compare_across_ranks(comm, std::span(&d, 1));
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0].ranks, std::vector<int>{1});
    EXPECT_EQ(m[0].majority, std::vector<int>{0});
    EXPECT_TRUE(m[0].tie);
    EXPECT_EQ(healthy_rank(m, 2), -1);
  });
  testing::rethrow_first(errors);
  // Pure cases over 4 ranks, two fields each (rank-major table).
  const std::vector<std::uint64_t> split = {5, 1, 5, 1, 6, 1, 6, 2};  // field 0: 2-2; field 1: 3-1
  auto m = find_mismatches(split, 4, 0, 2);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_TRUE(m[0].tie);
  EXPECT_FALSE(m[1].tie);
  EXPECT_EQ(m[1].ranks, std::vector<int>{3});
  EXPECT_EQ(healthy_rank(m, 4), -1);
  EXPECT_EQ(healthy_rank(std::span(m).subspan(1), 4), 0);
  const std::vector<std::uint64_t> three_ways = {7, 7, 8, 9};  // 2-1-1: a majority of the groups
  m = find_mismatches(three_ways, 4, 0, 1);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_FALSE(m[0].tie);
  EXPECT_EQ(m[0].ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(healthy_rank(m, 4), 0);
}

// find_mismatches is pure and public: a table that is not world_size rows,
// or columns past its width, is refused (it divided by zero, or read past
// the table).
TEST(CompareAcrossRanks, FindMismatchesRefusesATableOfAnotherShape) {
  const std::vector<std::uint64_t> table(6, 1);
  EXPECT_THROW(find_mismatches(table, 0, 0, 1), InvalidArgument);
  EXPECT_THROW(find_mismatches(table, 4, 0, 1), InvalidArgument);  // 6 words are not 4 rows
  EXPECT_THROW(find_mismatches(table, 2, 2, 2), InvalidArgument);  // columns [2, 4) of 3
  EXPECT_THROW(find_mismatches(table, 2, 4, 0), InvalidArgument);
  EXPECT_TRUE(find_mismatches(table, 2, 1, 2).empty());
  EXPECT_TRUE(find_mismatches(table, 2, 3, 0).empty());
}

std::vector<HandshakeField> fields(int rank, const std::string& odd_field, int odd_rank) {
  std::vector<HandshakeField> f = {
      {"build version", "0.1.0"},
      {"--seed", "0"},
      {"--lr", "0x1.99999ap-4"},
      {"model (parameter names, shapes and order)", "0.weight 512x784 0.bias 512"},
      {"bucket layout", "bucket 0: 1 MiB, tensors 2.bias 2.weight"}};
  for (auto& x : f)
    if (x.name == odd_field && rank == odd_rank) x.value += " (other)";
  return f;
}

TEST(Handshake, AgreeingRanksPass) {
  testing::rethrow_first(
      run_ranks(5, [](comm::Communicator& comm) { handshake(comm, fields(comm.rank(), "", -1)); }));
}

// The cases: another seed, lr, width or bucket layout on one rank is
// refused on every rank, naming the field and the rank.
TEST(Handshake, RefusesOnEveryRankNamingFieldAndRank) {
  for (std::string field : {"--seed", "--lr", "model (parameter names, shapes and order)", "bucket layout"}) {
    auto errors =
        run_ranks(4, [&](comm::Communicator& comm) { handshake(comm, fields(comm.rank(), field, 2)); });
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(errors[r]) << field << ": rank " << r << " started";
      try {
        std::rethrow_exception(errors[r]);
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(field + " differs on rank 2 from ranks 0, 1 and 3"), std::string::npos) << what;
      }
    }
  }
}

TEST(Handshake, AnotherListOfFieldsIsRefused) {
  auto errors = run_ranks(3, [](comm::Communicator& comm) {
    auto f = fields(comm.rank(), "", -1);
    if (comm.rank() == 1) f.push_back({"--new-flag", "1"});
    handshake(comm, f);
  });
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const InvalidArgument& x) {
      EXPECT_NE(std::string(x.what()).find("rank 1 describes its run with other fields"), std::string::npos)
          << x.what();
    }
  }
}

}  // namespace
}  // namespace lockstep::ddp
