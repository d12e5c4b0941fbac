#include "lockstep/ddp/gradient_sync.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "comm/run_ranks.h"
#include "lockstep/ddp/sampler.h"

namespace lockstep::ddp {
namespace {

using lockstep::testing::rethrow_first;
using lockstep::testing::run_ranks;

constexpr std::size_t P = 6;  // gradient length

// The gradient of global sample s, element i: made-up known numbers whose
// mean differs across the samples' positions (a trend in s).
double sample_grad(std::int64_t s, std::size_t i) {
  return std::sin(0.37 * double(s) + double(i)) + 0.01 * double(s) * double(i + 1);
}

// A replica's local gradient: the mean over its samples [begin, begin + count).
std::vector<float> local_mean(std::int64_t begin, std::int64_t count) {
  std::vector<float> g(P, 0.0f);
  if (count == 0) return g;
  for (std::size_t i = 0; i < P; ++i) {
    double sum = 0;
    for (std::int64_t s = begin; s < begin + count; ++s) sum += sample_grad(s, i);
    g[i] = static_cast<float>(sum / double(count));
  }
  return g;
}

// Runs average_gradients on `counts.size()` ranks, rank r owning the next
// counts[r] samples, and returns every rank's result.
std::vector<std::vector<float>> sync(const std::vector<std::int64_t>& counts, comm::Algorithm algorithm) {
  const int n = static_cast<int>(counts.size());
  const std::int64_t global = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  std::vector<std::int64_t> begins(n, 0);
  for (int r = 1; r < n; ++r) begins[r] = begins[r - 1] + counts[r - 1];
  std::vector<std::vector<float>> out(n);
  rethrow_first(run_ranks(n, [&](comm::Communicator& comm) {
    const int r = comm.rank();
    auto g = local_mean(begins[r], counts[r]);
    average_gradients(comm, g, counts[r], global, algorithm);
    out[r] = std::move(g);
  }));
  return out;
}

void expect_bitwise_identical(const std::vector<std::vector<float>>& results) {
  for (std::size_t r = 1; r < results.size(); ++r) {
    ASSERT_EQ(results[r].size(), results[0].size());
    EXPECT_EQ(0, std::memcmp(results[r].data(), results[0].data(), results[0].size() * sizeof(float)))
        << "rank " << r << " differs from rank 0";
  }
}

TEST(AverageGradients, EqualShardsGivePlainMeanOnEveryRank) {
  for (comm::Algorithm algorithm : {comm::Algorithm::Auto, comm::Algorithm::Ring, comm::Algorithm::Naive}) {
    for (int n : {1, 2, 3, 4, 8}) {
      std::vector<std::vector<float>> out(n);
      rethrow_first(run_ranks(n, [&](comm::Communicator& comm) {
        // Rank r's gradient: small integers, so the sum is exact in float.
        std::vector<float> g(P);
        for (std::size_t i = 0; i < P; ++i) g[i] = float((comm.rank() + 1) * (int(i) + 1) - 3);
        average_gradients(comm, g, 16, 16 * n, algorithm);
        out[comm.rank()] = std::move(g);
      }));
      for (std::size_t i = 0; i < P; ++i) {
        // mean over r of (r+1)(i+1) - 3 = (n+1)/2 (i+1) - 3
        const double want = (n + 1) / 2.0 * double(i + 1) - 3.0;
        EXPECT_NEAR(out[0][i], want, 1e-6 * std::abs(want) + 1e-7) << "n=" << n << " i=" << i;
      }
      expect_bitwise_identical(out);
    }
  }
}

TEST(AverageGradients, EqualShardsMeanOfRealGradients) {
  const std::vector<std::int64_t> counts(4, 25);
  const auto out = sync(counts, comm::Algorithm::Auto);
  for (std::size_t i = 0; i < P; ++i) {
    double want = 0;
    for (std::int64_t s = 0; s < 100; ++s) want += sample_grad(s, i);
    want /= 100;
    EXPECT_NEAR(out[0][i], want, 1e-5) << i;
  }
  expect_bitwise_identical(out);
}

// The card's example: 7 replicas with 32 samples and one with 11 (235 in all).
void check_ragged(const std::vector<std::int64_t>& counts, comm::Algorithm algorithm) {
  const std::int64_t global = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  ASSERT_EQ(global, 235);
  const auto out = sync(counts, algorithm);
  expect_bitwise_identical(out);
  std::int64_t begin = 0;
  std::vector<double> mean_of_means(P, 0.0);
  for (std::int64_t c : counts) {
    const auto m = local_mean(begin, c);
    for (std::size_t i = 0; i < P; ++i) mean_of_means[i] += double(m[i]) / double(counts.size());
    begin += c;
  }
  for (std::size_t i = 0; i < P; ++i) {
    double exact = 0;
    for (std::int64_t s = 0; s < global; ++s) exact += sample_grad(s, i);
    exact /= double(global);
    // The chosen numbers must separate the two answers, or this proves nothing.
    ASSERT_GT(std::abs(exact - mean_of_means[i]), 1e-3) << i;
    EXPECT_NEAR(out[0][i], exact, 1e-5) << "element " << i;
    EXPECT_GT(std::abs(out[0][i] - mean_of_means[i]), 1e-3) << "element " << i << " is a mean of means";
  }
}

TEST(AverageGradients, RaggedShardsGiveExactMeanOverAllSamples) {
  std::vector<std::int64_t> counts(8, 32);
  counts.back() = 11;
  for (comm::Algorithm algorithm : {comm::Algorithm::Auto, comm::Algorithm::Ring, comm::Algorithm::Naive}) {
    check_ragged(counts, algorithm);
  }
}

TEST(AverageGradients, RaggedShortShardInTheMiddle) {
  std::vector<std::int64_t> counts(8, 32);
  counts[3] = 11;
  check_ragged(counts, comm::Algorithm::Auto);
}

TEST(AverageGradients, EmptyShardContributesNothing) {
  // The sampler's kept last step of 10 samples over 4 replicas with micro 2
  // has shards of 0, 1, 0 and 1 samples.
  DistributedSampler sampler({.dataset_size = 10,
                              .world_size = 4,
                              .micro_batch = 2,
                              .shuffle = false,
                              .last_batch = LastBatch::Keep});
  const std::int64_t step = sampler.steps_per_epoch() - 1;
  std::vector<std::int64_t> counts;
  for (int r = 0; r < 4; ++r) counts.push_back(sampler.shard(step, r).size());
  ASSERT_EQ(counts, (std::vector<std::int64_t>{0, 1, 0, 1}));
  const auto out = sync(counts, comm::Algorithm::Auto);
  expect_bitwise_identical(out);
  for (std::size_t i = 0; i < P; ++i) {
    // Samples 0 and 1 of the made-up numbering (ranks 1 and 3 own one each).
    const double want = (sample_grad(0, i) + sample_grad(1, i)) / 2;
    EXPECT_NEAR(out[0][i], want, 1e-6) << i;
  }
}

TEST(AverageGradients, RaggedShardsFromTheSampler) {
  // 1003 samples, 8 x 32: the kept last step has 235 samples cut 29/30.
  DistributedSampler sampler(
      {.dataset_size = 1003, .world_size = 8, .micro_batch = 32, .last_batch = LastBatch::Keep});
  const std::int64_t step = sampler.steps_per_epoch() - 1;
  std::vector<std::int64_t> counts;
  for (int r = 0; r < 8; ++r) counts.push_back(sampler.shard(step, r).size());
  ASSERT_EQ(sampler.shard(step, 0).global_count, 235);
  const auto out = sync(counts, comm::Algorithm::Ring);
  expect_bitwise_identical(out);
  for (std::size_t i = 0; i < P; ++i) {
    double exact = 0;
    for (std::int64_t s = 0; s < 235; ++s) exact += sample_grad(s, i);
    EXPECT_NEAR(out[0][i], exact / 235, 1e-5) << i;
  }
}

}  // namespace
}  // namespace lockstep::ddp
