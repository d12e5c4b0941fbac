#include "lockstep/ddp/reducer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "comm/run_ranks.h"
#include "lockstep/comm/modelled_link.h"
#include "lockstep/ddp/gradient_sync.h"
#include "lockstep/error.h"

namespace lockstep::ddp {
namespace {

using lockstep::testing::rethrow_first;
using lockstep::testing::run_ranks;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kFloatsPerMiB = kMiB / sizeof(float);

std::vector<std::size_t> tensors_of(const std::vector<Bucket>& buckets) {
  std::vector<std::size_t> all;
  for (const auto& b : buckets) all.insert(all.end(), b.tensors.begin(), b.tensors.end());
  return all;
}

TEST(BucketAssignment, ReverseOrderContiguousAndComplete) {
  const std::vector<std::size_t> numels = {100, 7, 3000, 1, 50};
  const auto buckets = assign_buckets(numels, 64, 4 * 1000);
  std::size_t next_end = 3158;  // total
  std::vector<std::size_t> expect_order = {4, 3, 2, 1, 0};
  EXPECT_EQ(tensors_of(buckets), expect_order);
  for (const auto& b : buckets) {  // launch order walks the span from the end
    EXPECT_EQ(b.offset + b.numel, next_end);
    std::size_t sum = 0;
    for (auto t : b.tensors) sum += numels[t];
    EXPECT_EQ(sum, b.numel);
    next_end = b.offset;
  }
  EXPECT_EQ(next_end, 0u);
}

TEST(BucketAssignment, FirstBucketUsesItsOwnCap) {
  // Two 1 MiB tensors then four 0.25 MiB: first cap 0.5 MiB, later caps 1 MiB.
  const std::size_t q = kFloatsPerMiB / 4;
  const std::vector<std::size_t> numels = {kFloatsPerMiB, kFloatsPerMiB, q, q, q, q};
  const auto buckets = assign_buckets(numels, kMiB / 2, kMiB);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].tensors, (std::vector<std::size_t>{5, 4}));     // 0.5 MiB: closes at the first cap
  EXPECT_EQ(buckets[1].tensors, (std::vector<std::size_t>{3, 2, 1}));  // 0.5 MiB < 1, then 1.5 MiB >= 1
  EXPECT_EQ(buckets[2].tensors, (std::vector<std::size_t>{0}));        // what is left
  EXPECT_EQ(buckets[1].bytes(), 2 * q * 4 + kMiB);
}

TEST(BucketAssignment, TensorLargerThanTheCapClosesItsBucket) {
  const std::vector<std::size_t> numels = {10, 8 * kFloatsPerMiB, 10};
  const auto buckets = assign_buckets(numels, kMiB, kMiB);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].tensors, (std::vector<std::size_t>{2, 1}));  // 40 B + 32 MiB: over the cap, closed
  EXPECT_EQ(buckets[1].tensors, (std::vector<std::size_t>{0}));
}

TEST(BucketAssignment, ZeroCapMeansOneBucket) {
  const std::vector<std::size_t> numels = {kFloatsPerMiB, kFloatsPerMiB, 3};
  const auto buckets = assign_buckets(numels, kMiB, 0);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].tensors, (std::vector<std::size_t>{2, 1, 0}));
  EXPECT_EQ(buckets[0].offset, 0u);
  EXPECT_EQ(buckets[0].numel, 2 * kFloatsPerMiB + 3);
}

TEST(BucketAssignment, NoTensorsNoBuckets) {
  EXPECT_TRUE(assign_buckets({}, kMiB, kMiB).empty());
}

TEST(BucketAssignment, DescribeNamesTensors) {
  const std::vector<std::size_t> numels = {262144, 4};
  const std::vector<std::string> names = {"0.weight", "0.bias"};
  EXPECT_EQ(describe_buckets(assign_buckets(numels, kMiB, kMiB), names),
            "bucket 0: 1.00 MiB, tensors 0.bias 0.weight\n");
}

// A made-up gradient: tensor sizes, and the value of element i on rank r.
const std::vector<std::size_t> kNumels = {300, 20, 5000, 40, 1000, 3};
float grad_value(int rank, std::size_t i, int step) {
  return std::sin(0.1f * float(i) + float(rank) * 1.7f + float(step)) * float(1 + rank % 3);
}
std::size_t total_numel() {
  return std::accumulate(kNumels.begin(), kNumels.end(), std::size_t{0});
}

enum class ReadyOrder { Backward, Forward, Shuffled };

// Runs `steps` steps of the reducer on n ranks (counts[r] samples on rank r)
// and returns each rank's final gradient of the last step.
std::vector<std::vector<float>> reduce_with(int n, const std::vector<std::int64_t>& counts,
                                            const ReducerOptions& options, ReadyOrder order, int steps = 2) {
  const std::int64_t global = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  std::vector<std::vector<float>> out(n);
  rethrow_first(run_ranks(n, [&](comm::Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> grads(total_numel());
    Reducer reducer(comm, grads, kNumels, options);
    std::mt19937 rng(r);
    for (int step = 0; step < steps; ++step) {
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = grad_value(r, i, step);
      std::vector<std::size_t> ts(kNumels.size());
      std::iota(ts.begin(), ts.end(), 0);
      if (order == ReadyOrder::Backward) std::reverse(ts.begin(), ts.end());
      if (order == ReadyOrder::Shuffled) std::shuffle(ts.begin(), ts.end(), rng);
      reducer.begin_step(counts[r], global);
      for (auto t : ts) reducer.mark_ready(t);
      const auto& timing = reducer.finish_step();
      for (std::size_t k = 1; k < timing.buckets.size(); ++k) {  // strictly in launch order
        EXPECT_GE(timing.buckets[k].start, timing.buckets[k - 1].end) << "bucket " << k;
      }
    }
    out[r] = grads;
  }));
  return out;
}

// The naive sibling: one all-reduce of everything after backward.
std::vector<std::vector<float>> average_with(int n, const std::vector<std::int64_t>& counts,
                                             comm::Algorithm algorithm, int step = 1) {
  const std::int64_t global = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  std::vector<std::vector<float>> out(n);
  rethrow_first(run_ranks(n, [&](comm::Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> grads(total_numel());
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = grad_value(r, i, step);
    average_gradients(comm, grads, counts[r], global, algorithm);
    out[r] = grads;
  }));
  return out;
}

void expect_bitwise_equal(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what;
}

TEST(Reducer, MatchesOneAllreduceAfterBackward) {
  // Naive reduces element-wise in rank order whatever the bucket cut, so the
  // bucketed result must equal the unbucketed one bit for bit.
  for (int n : {1, 2, 3, 5, 8}) {
    for (auto order : {ReadyOrder::Backward, ReadyOrder::Forward, ReadyOrder::Shuffled}) {
      const std::vector<std::int64_t> counts(n, 16);
      const auto got = reduce_with(
          n, counts, {.first_bucket_mb = 0.001, .bucket_mb = 0.01, .algorithm = comm::Algorithm::Naive},
          order);
      const auto want = average_with(n, counts, comm::Algorithm::Naive);
      for (int r = 0; r < n; ++r) {
        expect_bitwise_equal(got[r], want[r], "n=" + std::to_string(n) + " rank " + std::to_string(r));
      }
    }
  }
}

TEST(Reducer, WithoutOverlapTheSameBucketsGiveTheSameBits) {
  const std::vector<std::int64_t> counts = {16, 16, 16, 5};
  ReducerOptions o{.first_bucket_mb = 0.001, .bucket_mb = 0.01, .algorithm = comm::Algorithm::Ring};
  const auto with = reduce_with(4, counts, o, ReadyOrder::Backward);
  o.overlap = false;
  const auto without = reduce_with(4, counts, o, ReadyOrder::Shuffled);
  for (int r = 0; r < 4; ++r) expect_bitwise_equal(with[r], without[r], "rank " + std::to_string(r));
}

TEST(Reducer, RaggedShardsAreWeightedBySampleCount) {
  // The card's case: seven replicas with 32 samples and one with 11.
  const std::vector<std::int64_t> counts = {32, 32, 32, 32, 32, 32, 32, 11};
  const auto got = reduce_with(
      8, counts, {.first_bucket_mb = 0.001, .bucket_mb = 0.004, .algorithm = comm::Algorithm::Naive},
      ReadyOrder::Backward);
  const auto want = average_with(8, counts, comm::Algorithm::Naive);
  expect_bitwise_equal(got[0], want[0], "ragged");
  // And that is the sample-weighted mean, not the mean of the replicas' means.
  const double global = 235;
  for (std::size_t i : {std::size_t{0}, std::size_t{4000}, total_numel() - 1}) {
    double weighted = 0, plain = 0;
    for (int r = 0; r < 8; ++r) {
      weighted += double(counts[r]) * grad_value(r, i, 1) / global;
      plain += grad_value(r, i, 1) / 8.0;
    }
    EXPECT_NEAR(got[3][i], weighted, 1e-5) << i;
    if (std::abs(weighted - plain) > 1e-3) {
      EXPECT_GT(std::abs(got[3][i] - plain), 1e-4) << i;
    }
  }
}

TEST(Reducer, EveryAlgorithmAgreesWithinRounding) {
  const std::vector<std::int64_t> counts(6, 8);
  const auto want = average_with(6, counts, comm::Algorithm::Naive);
  for (auto algorithm : {comm::Algorithm::Auto, comm::Algorithm::Ring, comm::Algorithm::HalvingDoubling}) {
    const auto got =
        reduce_with(6, counts, {.first_bucket_mb = 0.002, .bucket_mb = 0.01, .algorithm = algorithm},
                    ReadyOrder::Backward);
    for (int r = 0; r < 6; ++r) {
      expect_bitwise_equal(got[r], got[0], "ranks agree");
      for (std::size_t i = 0; i < want[0].size(); ++i) ASSERT_NEAR(got[r][i], want[0][i], 1e-5);
    }
  }
}

TEST(Reducer, Bf16CompressionHalvesBytesWithBoundedError) {
  const int n = 4;
  const std::vector<std::int64_t> counts(n, 8);
  const ReducerOptions exact{.first_bucket_mb = 0.002, .bucket_mb = 0.01, .algorithm = comm::Algorithm::Ring};
  ReducerOptions bf16 = exact;
  bf16.compression = Compression::Bf16;
  std::uint64_t bytes[2] = {0, 0};
  std::vector<float> result[2];
  for (int c = 0; c < 2; ++c) {
    std::vector<std::vector<float>> out(n);
    rethrow_first(run_ranks(n, [&](comm::Communicator& comm) {
      const int r = comm.rank();
      std::vector<float> grads(total_numel());
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = grad_value(r, i, 0);
      Reducer reducer(comm, grads, kNumels, c == 0 ? exact : bf16);
      reducer.begin_step(8, 8 * n);
      for (std::size_t t = kNumels.size(); t-- > 0;) reducer.mark_ready(t);
      const auto& timing = reducer.finish_step();
      if (r == 0)
        for (const auto& b : timing.buckets) bytes[c] += b.bytes_sent;
      out[r] = grads;
    }));
    for (int r = 1; r < n; ++r) expect_bitwise_equal(out[r], out[0], "ranks agree");
    result[c] = out[0];
  }
  EXPECT_EQ(bytes[1] * 2, bytes[0]);
  // Each element is a mean of n values of magnitude <= 3: bf16 keeps 8 bits,
  // and the n-1 partial sums and the final scaling round at most n+1 times.
  double worst = 0;
  for (std::size_t i = 0; i < result[0].size(); ++i) {
    worst = std::max(worst, double(std::abs(result[1][i] - result[0][i])));
  }
  EXPECT_LE(worst, (n + 1) * 3.0 * std::ldexp(1.0, -8));
  EXPECT_GT(worst, 0.0) << "the compressed path must actually round";
}

TEST(Reducer, ErrorFeedbackCarriesTheRoundingToTheNextStep) {
  // A constant gradient whose value bf16 cannot hold: over many steps the
  // sum of what was applied must track the true sum, because every step's
  // rounding error is sent again in the next.
  const int n = 2, steps = 64;
  const float g = 1.0f + std::ldexp(1.0f, -10);  // between two bf16 values
  double applied[2] = {0, 0};
  rethrow_first(run_ranks(n, [&](comm::Communicator& comm) {
    std::vector<float> grads(4);
    const std::vector<std::size_t> numels = {4};
    Reducer reducer(comm, grads, numels, {.compression = Compression::Bf16});
    double sum = 0;
    for (int s = 0; s < steps; ++s) {
      std::fill(grads.begin(), grads.end(), g);
      reducer.begin_step(1, n);
      reducer.mark_ready(0);
      reducer.finish_step();
      sum += grads[0];
    }
    applied[comm.rank()] = sum;
  }));
  EXPECT_NEAR(applied[0], double(g) * steps, 2 * std::ldexp(1.0, -8));
  EXPECT_NE(applied[0], 1.0 * steps) << "without error feedback every step would round to 1";
}

// A skipped step's rounding error is forgotten: the next step sends what a
// fresh reducer would. A huge gradient that forced a skip (an overflow) left
// 2^-8 of itself in the residual, to poison the step after.
TEST(Reducer, ASkippedStepLeavesNoErrorFeedbackBehind) {
  const int n = 2;
  const float g = 1.0f + std::ldexp(1.0f, -10);  // between two bf16 values: a residual
  std::vector<float> after_discard(4), fresh(4);
  rethrow_first(run_ranks(n, [&](comm::Communicator& comm) {
    std::vector<float> grads(4);
    const std::vector<std::size_t> numels = {4};
    Reducer reducer(comm, grads, numels, {.compression = Compression::Bf16});
    const auto step = [&](float value) {
      std::fill(grads.begin(), grads.end(), value);
      reducer.begin_step(1, n);
      reducer.mark_ready(0);
      reducer.finish_step();
    };
    step(3e36f);  // skipped by the trainer
    reducer.discard_error_feedback();
    step(g);
    if (comm.rank() == 0) after_discard = grads;
    Reducer other(comm, grads, numels, {.compression = Compression::Bf16});
    std::fill(grads.begin(), grads.end(), g);
    other.begin_step(1, n);
    other.mark_ready(0);
    other.finish_step();
    if (comm.rank() == 0) fresh = grads;
  }));
  EXPECT_EQ(after_discard, fresh);
}

TEST(Reducer, LayoutMismatchIsRejectedOnEveryRank) {
  const auto errors = run_ranks(3, [&](comm::Communicator& comm) {
    std::vector<float> grads(total_numel());
    // Rank 2 asks for one bucket, the others for several.
    Reducer reducer(comm, grads, kNumels,
                    {.first_bucket_mb = 0.001, .bucket_mb = comm.rank() == 2 ? 0.0 : 0.01});
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    }
  }
}

// A step that failed in its all-reduce has ended, with overlap or without:
// the next step's calls meet the group's own error, not "begin_step() called
// again before finish_step()" (what the reducer said without overlap).
TEST(Reducer, AFailedStepHasEndedAndTheNextMeetsTheGroupsError) {
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    std::string second_error;
    run_ranks(2, [&](comm::Communicator& comm) {
      std::vector<float> grads(total_numel());
      Reducer reducer(comm, grads, kNumels, {.overlap = overlap});
      if (comm.rank() == 1) {
        comm.abort("rank 1 leaves");
        return;
      }
      const auto step = [&] {
        reducer.begin_step(1, 2);
        for (std::size_t t = kNumels.size(); t-- > 0;) reducer.mark_ready(t);
        reducer.finish_step();
      };
      EXPECT_THROW(step(), Error);
      try {
        step();
      } catch (const std::exception& e) {
        second_error = e.what();
        EXPECT_NE(dynamic_cast<const CommAborted*>(&e), nullptr) << e.what();
      }
    });
    EXPECT_EQ(second_error.find("called again"), std::string::npos) << second_error;
    EXPECT_FALSE(second_error.empty());
  }
}

// Sample counts past 2^63 / N: the weight is computed without overflow.
// Rank 0 holds all but one of 2^62 + 1 samples; with 3 ranks, 3 x 2^62
// wrapped to -2^62 and the mean came out negated.
TEST(Reducer, HugeSampleCountsWeightWithoutOverflow) {
  const std::int64_t global = (std::int64_t{1} << 62) + 1;
  std::vector<std::vector<float>> out(3);
  rethrow_first(run_ranks(3, [&](comm::Communicator& comm) {
    std::vector<float> grads = {comm.rank() == 0 ? 1.5f : 0.0f, comm.rank() == 0 ? -2.0f : 0.0f};
    average_gradients(comm, grads, comm.rank() == 0 ? global - 1 : (comm.rank() == 1 ? 1 : 0), global,
                      comm::Algorithm::Ring);
    out[comm.rank()] = grads;
  }));
  for (const auto& g : out) {
    EXPECT_NEAR(g[0], 1.5f, 1e-5f);
    EXPECT_NEAR(g[1], -2.0f, 1e-5f);
  }
}

TEST(Reducer, ARankThatLeavesMidStepDoesNotHangTheOthers) {
  const auto errors = run_ranks(4, [&](comm::Communicator& comm) {
    std::vector<float> grads(total_numel());
    Reducer reducer(comm, grads, kNumels, {.first_bucket_mb = 0.001, .bucket_mb = 0.001});
    reducer.begin_step(1, 4);
    for (std::size_t t = kNumels.size(); t-- > 0;) {
      if (comm.rank() == 1 && t == 2) throw std::runtime_error("backward failed on rank 1");
      reducer.mark_ready(t);
    }
    reducer.finish_step();
  });
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(errors[r]) << "rank " << r;
}

// A rank whose reducer is refused (its own options or spans) or that cannot
// begin a step aborts the group: the others, already in the constructor's
// layout check or the step's all-reduces, stop at once instead of waiting for
// it until their timeout (60 s here; the 20 s wall-clock guard fails a wait).
TEST(Reducer, ARefusalOnOneRankStopsEveryRankAtOnce) {
  for (int variant = 0; variant < 3; ++variant) {
    const auto errors = run_ranks(
        3,
        [&](comm::Communicator& comm) {
          const bool odd = comm.rank() == 1;
          std::vector<float> grads(total_numel() - (odd && variant == 1 ? 1 : 0));
          Reducer reducer(comm, grads, kNumels, {.bucket_mb = odd && variant == 0 ? -1.0 : 25.0});
          reducer.begin_step(odd && variant == 2 ? -1 : 1, 3);
          for (std::size_t t = kNumels.size(); t-- > 0;) reducer.mark_ready(t);
          reducer.finish_step();
        },
        std::chrono::seconds(60), std::chrono::seconds(20));
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(errors[r]) << "variant " << variant << ", rank " << r;
      try {
        std::rethrow_exception(errors[r]);
      } catch (const InvalidArgument& e) {
        EXPECT_EQ(r, 1) << e.what();
      } catch (const CommAborted& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1: "), std::string::npos) << e.what();
      }
    }
  }
}

// Replicas given different global sample counts would weight their
// gradients differently and go on with wrong means. Every bucket's
// fingerprint carries the count, so the step fails on every replica, naming
// both counts, on every path: overlapped or not, float or bf16, one bucket or
// several, the shared-memory path and the point-to-point ring; and
// average_gradients, the reducer's naive sibling, alike.
TEST(Reducer, ReplicasGivenDifferentGlobalCountsFailTheStepNamingBoth) {
  struct Case {
    ReducerOptions options;
    const char* name;
  };
  const std::vector<Case> cases = {
      {{}, "default"},
      {{.bucket_mb = 0}, "one bucket"},
      {{.overlap = false}, "after backward"},
      {{.algorithm = comm::Algorithm::Ring}, "ring"},
      {{.compression = Compression::Bf16}, "bf16"},
  };
  auto expect_named = [](const std::vector<std::exception_ptr>& errors, const char* name) {
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(errors[r]) << name << ", rank " << r;
      try {
        std::rethrow_exception(errors[r]);
      } catch (const CommAborted& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("global batch of 6 samples"), std::string::npos) << name << ": " << what;
        EXPECT_NE(what.find("global batch of 7 samples"), std::string::npos) << name << ": " << what;
      }
    }
  };
  for (const auto& c : cases) {
    const auto errors = run_ranks(
        3,
        [&](comm::Communicator& comm) {
          std::vector<float> grads(total_numel(), 1.0f);
          Reducer reducer(comm, grads, kNumels, c.options);
          reducer.begin_step(2, comm.rank() == 2 ? 7 : 6);
          for (std::size_t t = kNumels.size(); t-- > 0;) reducer.mark_ready(t);
          reducer.finish_step();
        },
        std::chrono::seconds(60), std::chrono::seconds(20));
    expect_named(errors, c.name);
  }
  const auto errors = run_ranks(
      3,
      [&](comm::Communicator& comm) {
        std::vector<float> grads(100, 1.0f);
        average_gradients(comm, grads, 2, comm.rank() == 0 ? 7 : 6);
      },
      std::chrono::seconds(60), std::chrono::seconds(20));
  expect_named(errors, "average_gradients");
}

// Duration::max() as the group's timeout waits as long as it takes: the
// reducer's own bound (timeout x (2 + buckets)) used to overflow, and
// finish_step gave up at once.
TEST(Reducer, TheLongestTimeoutWaitsInsteadOfOverflowing) {
  for (const double bucket_mb : {0.0, 0.001, 0.004, 0.01, 0.03})  // 1 to 3 buckets: the product wrapped to either sign
  rethrow_first(testing::run_group(
      comm::make_thread_group({.world_size = 3, .timeout = comm::Duration::max()}), [&](comm::Communicator& comm) {
        std::vector<float> grads(total_numel(), 1.0f);
        Reducer reducer(comm, grads, kNumels, {.first_bucket_mb = 0.001, .bucket_mb = bucket_mb});
        reducer.begin_step(1, 3);
        for (std::size_t t = kNumels.size(); t-- > 0;) {
          if (comm.rank() == 2 && t == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
          reducer.mark_ready(t);
        }
        reducer.finish_step();
        EXPECT_EQ(grads[0], 1.0f);
      }));
}

// A bucket's all-reduce waits once per round, each wait within the group's
// timeout, so over a slow link the whole may rightly take longer than
// timeout x (2 + buckets), the reducer's bound for its own wait; finish_step
// used to throw TimeoutError (and abort the group) on such a healthy step.
// 8 ranks, one bucket, the ring: 14 rounds of 100 ms each (the modelled link
// delays every message by its latency, so the bucket takes at least 1.4 s)
// against a 400 ms timeout, whose bound was 1.2 s.
TEST(Reducer, AnAllreduceOfSeveralTimeoutsInAllIsNotATimeout) {
  auto comms = comm::with_modelled_link(
      comm::make_thread_group({.world_size = 8, .timeout = std::chrono::milliseconds(400)}),
      {.latency = std::chrono::milliseconds(100)});
  rethrow_first(testing::run_group(comms, [&](comm::Communicator& comm) {
    std::vector<float> grads(total_numel(), float(comm.rank()));
    Reducer reducer(comm, grads, kNumels, {.bucket_mb = 0, .algorithm = comm::Algorithm::Ring});
    ASSERT_EQ(reducer.buckets().size(), 1u);
    reducer.begin_step(1, 8);
    for (std::size_t t = kNumels.size(); t-- > 0;) reducer.mark_ready(t);
    reducer.finish_step();
    EXPECT_EQ(grads[0], 3.5f);  // the mean of 0..7
    EXPECT_EQ(grads.back(), 3.5f);
  }));
}

TEST(Reducer, AnnouncingATensorTwiceOrNeverIsAnError) {
  rethrow_first(run_ranks(1, [&](comm::Communicator& comm) {
    std::vector<float> grads(total_numel());
    Reducer reducer(comm, grads, kNumels);
    reducer.begin_step(1, 1);
    reducer.mark_ready(0);
    EXPECT_THROW(reducer.mark_ready(0), Error);
    EXPECT_THROW(reducer.finish_step(), Error);
  }));
}

// A rank whose step cannot finish (a tensor never announced) refuses it at
// once: the group is aborted, so the rank waiting for its buckets is woken
// with the reason instead of timing out (a library review: 60 s, then a
// TimeoutError that named no cause), and the step is over on both, so the
// next begin_step is not refused as "called again" (its collectives meet the abort).
TEST(Reducer, ATensorNeverAnnouncedStopsEveryRankAtOnce) {
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    const auto errors = run_ranks(
        2,
        [&](comm::Communicator& comm) {
          std::vector<float> grads(total_numel());
          Reducer reducer(comm, grads, kNumels, {.overlap = overlap});
          reducer.begin_step(1, 2);
          for (std::size_t t = kNumels.size(); t-- > 0;) {
            if (comm.rank() == 1 && t == 0) continue;  // forgotten
            reducer.mark_ready(t);
          }
          try {
            reducer.finish_step();
          } catch (const Error&) {
            try {
              reducer.begin_step(1, 2);  // the step has ended: no "called again" (its collectives meet the abort)
            } catch (const std::exception& e) {
              EXPECT_EQ(std::string(e.what()).find("called again"), std::string::npos) << e.what();
            }
            throw;
          }
        },
        std::chrono::seconds(30));  // a wait for rank 1's buckets would end in a TimeoutError
    ASSERT_TRUE(errors[1]);
    try {
      std::rethrow_exception(errors[1]);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("tensor 0 was never marked ready"), std::string::npos) << e.what();
    }
    ASSERT_TRUE(errors[0]);
    try {
      std::rethrow_exception(errors[0]);
    } catch (const CommAborted& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1: Reducer::finish_step(): tensor 0 was never marked ready"),
                std::string::npos)
          << e.what();
    }
  }
}

// Reducer::gather completes a sharded step; on a reducer that does not shard
// it used to overwrite every replica's weights with chunks of the others'.
// owned_ranges refuses a rank outside the group (it divided by a world size
// of 0, and gave rank 7 of 2 another rank's chunks).
TEST(Reducer, GatherNeedsAShardedReducerAndOwnedRangesAValidRank) {
  rethrow_first(run_ranks(2, [&](comm::Communicator& comm) {
    std::vector<float> grads(total_numel()), params(total_numel(), float(comm.rank()));
    Reducer reducer(comm, grads, kNumels);
    EXPECT_THROW(reducer.gather(params), InvalidArgument);
    EXPECT_TRUE(std::all_of(params.begin(), params.end(), [&](float v) { return v == float(comm.rank()); }));
    EXPECT_THROW(owned_ranges(reducer.buckets(), 0, 0), InvalidArgument);
    EXPECT_THROW(owned_ranges(reducer.buckets(), 7, 2), InvalidArgument);
    EXPECT_FALSE(owned_ranges(reducer.buckets(), comm.rank(), 2).empty());
  }));
}

// An algorithm the group cannot run is refused when the reducer is built, on
// every rank alike, not at the first step (where the native all-reduce
// failed as InvalidArgument on one rank and CommAborted on the others).
TEST(Reducer, AnAlgorithmTheGroupCannotRunIsRefusedWhenBuilt) {
  for (const auto algorithm : {comm::Algorithm::Tree, comm::Algorithm::Hierarchical, comm::Algorithm::Native}) {
    SCOPED_TRACE(comm::to_string(algorithm));
    rethrow_first(run_ranks(3, [&](comm::Communicator& comm) {
      std::vector<float> grads(total_numel());
      EXPECT_THROW(Reducer(comm, grads, kNumels, {.algorithm = algorithm}), InvalidArgument);
    }));
  }
  rethrow_first(run_ranks(4, [&](comm::Communicator& comm) {
    std::vector<float> grads(total_numel());
    Reducer reducer(comm, grads, kNumels, {.algorithm = comm::Algorithm::Tree});  // a power of two: runs
  }));
}

// A bucket size under one byte truncated to 0 bytes, which is one bucket
// after backward: the smallest buckets asked for, no overlap given.
TEST(Reducer, ABucketSizeUnderOneByteIsRefusedNotReadAsOneBucket) {
  rethrow_first(run_ranks(1, [&](comm::Communicator& comm) {
    std::vector<float> grads(total_numel());
    EXPECT_THROW(Reducer(comm, grads, kNumels, {.first_bucket_mb = 1e-7, .bucket_mb = 1e-7}),
                 InvalidArgument);
  }));
  // A byte or more is a bucket per tensor here; a first bucket under a byte
  // holds one tensor as one of a byte does. (A fresh group: the refusal
  // aborted the first.)
  rethrow_first(run_ranks(1, [&](comm::Communicator& comm) {
    std::vector<float> grads(total_numel());
    Reducer one_byte(comm, grads, kNumels, {.first_bucket_mb = 1e-7, .bucket_mb = 1e-6});
    EXPECT_EQ(one_byte.buckets().size(), kNumels.size());
  }));
}

TEST(Reducer, RejectsAGradientSpanOfTheWrongSize) {
  rethrow_first(run_ranks(1, [&](comm::Communicator& comm) {
    std::vector<float> grads(total_numel() - 1);
    EXPECT_THROW(Reducer(comm, grads, kNumels), InvalidArgument);
    std::vector<float> ok(total_numel());
    EXPECT_THROW(Reducer(comm, ok, kNumels, {.bucket_mb = -1}), InvalidArgument);
  }));
}

}  // namespace
}  // namespace lockstep::ddp
