// The segmented (pipelined) ring: with chunks larger than a segment, every
// element must still be reduced in the ring's order, the same bits as the
// naive sibling below, and the bytes on the wire must stay 2P(N-1)/N, in
// 2(N-1) messages per segment.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "order_sensitive_inputs.h"
#include "run_ranks.h"

namespace lockstep::comm {
namespace {

using testing::rethrow_first;
using testing::run_ranks;

std::vector<float> ring_inputs(int rank, std::size_t count) {
  return testing::order_sensitive_inputs(77, rank, count);
}

// The naive sibling of the ring's order: element i lies in chunk c, which
// starts at rank c and picks up ranks c+1, c+2, ... in turn, each adding
// its own value to what arrives. Mean scales the sum by 1/N at the end.
float ring_order(const std::vector<std::vector<float>>& in, std::size_t i, std::size_t count, ReduceOp op) {
  const int n = static_cast<int>(in.size());
  int c = 0;
  while (count * static_cast<std::size_t>(c + 1) / n <= i) ++c;
  float acc = in[c][i];
  for (int k = 1; k < n; ++k) {
    const float x = in[(c + k) % n][i];
    acc = op == ReduceOp::Max ? std::max(x, acc) : x + acc;
  }
  return op == ReduceOp::Mean ? acc * (1.0f / static_cast<float>(n)) : acc;
}

TEST(RingSegments, LargeChunksAreReducedInRingOrderBitForBit) {
  const std::size_t segment_bytes = std::size_t{256} << 10;  // small, to keep the test quick
  const std::size_t segment_floats = segment_bytes / sizeof(float);
  for (int n : {2, 3, 5}) {
    // Chunks of 2.5 segments and a few elements: three uneven segments each.
    const std::size_t count = static_cast<std::size_t>(n) * (segment_floats * 5 / 2) + n - 1;
    for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
      std::vector<std::vector<float>> results(n);
      std::vector<CommStats> used(n);
      rethrow_first(run_ranks(n, [&](Communicator& comm) {
        auto data = ring_inputs(comm.rank(), count);
        const CommStats before = comm.stats();
        allreduce(comm, data,
                  {.op = op, .algorithm = Algorithm::Ring, .verify = false, .ring_segment_bytes = segment_bytes});
        const CommStats after = comm.stats();
        used[comm.rank()] = {after.bytes_sent - before.bytes_sent, after.bytes_received - before.bytes_received,
                             after.messages_sent - before.messages_sent};
        results[comm.rank()] = std::move(data);
      }));
      std::vector<std::vector<float>> in;
      for (int r = 0; r < n; ++r) in.push_back(ring_inputs(r, count));
      for (std::size_t i = 0; i < count; ++i) {
        const float want = ring_order(in, i, count, op);
        ASSERT_EQ(std::memcmp(&results[0][i], &want, 4), 0)
            << "n=" << n << " op=" << to_string(op) << " i=" << i << ": " << results[0][i] << " vs " << want;
      }
      for (int r = 1; r < n; ++r)
        ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * 4)) << "rank " << r;
      // Rank r sends every chunk but r+1 in the reduce-scatter, and every
      // chunk but r+2 in the all-gather.
      auto chunk_size = [&](int c) {
        c %= n;
        return count * static_cast<std::size_t>(c + 1) / n - count * static_cast<std::size_t>(c) / n;
      };
      for (int r = 0; r < n; ++r) {
        const std::size_t sent = 2 * count - chunk_size(r + 1) - chunk_size(r + 2);
        EXPECT_EQ(used[r].bytes_sent, sent * sizeof(float)) << "n=" << n << " rank " << r;
        EXPECT_EQ(used[r].messages_sent, 2u * (n - 1) * 3) << "n=" << n << " rank " << r;
      }
    }
  }
}

// The segment size cuts the ring's messages and tags, so ranks must agree on
// it: the fingerprint check names both calls instead of letting mismatched
// messages meet.
TEST(RingSegments, DifferentSegmentSizesAreACollectiveMismatch) {
  const std::size_t count = 3 * ((std::size_t{1} << 20) / sizeof(float));
  std::vector<std::string> what(3);
  const auto errors = run_ranks(3, [&](Communicator& comm) {
    std::vector<float> data(count, 1.0f);
    const std::size_t segment = comm.rank() == 1 ? std::size_t{256} << 10 : 0;
    try {
      allreduce(comm, data, {.algorithm = Algorithm::Ring, .ring_segment_bytes = segment});
    } catch (const CommAborted& e) {
      what[comm.rank()] = e.what();
    }
  });
  rethrow_first(errors);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(what[r].find("collective mismatch"), std::string::npos) << "rank " << r << ": " << what[r];
  }
  const std::string all = what[0] + what[1] + what[2];
  EXPECT_NE(all.find("in segments of 262144 bytes"), std::string::npos) << all;
}

}  // namespace
}  // namespace lockstep::comm
