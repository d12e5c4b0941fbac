// The modelled link: parsing of its flags, and wrapped groups whose messages
// take at least latency + bytes / bandwidth while the results and the bytes
// counted stay exactly those of the unwrapped group. Timing checks are lower
// bounds from the model only (sleeping guarantees them); every run is under a
// wall-clock guard, so a hang fails the test.
#include "lockstep/comm/modelled_link.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <thread>

#include "comm/run_ranks.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/comm/threads.h"
#include "lockstep/error.h"
#include "p2p_only.h"

namespace lockstep::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::rethrow_first;

// Tests here finish in well under a second; a hang fails after 20 s.
std::vector<std::exception_ptr> run_group(const std::vector<std::unique_ptr<Communicator>>& comms,
                                          const std::function<void(Communicator&)>& fn,
                                          std::chrono::seconds guard = 20s) {
  return lockstep::testing::run_group(comms, fn, guard);
}

std::vector<std::unique_ptr<Communicator>> linked_group(int n, const LinkModel& link,
                                                        Duration timeout = 10s) {
  return with_modelled_link(make_thread_group({.world_size = n, .timeout = timeout}), link);
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

TEST(ModelledLinkParse, BandwidthExactValues) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("10Gbit"), 1.25e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("10Gbit/s"), 1.25e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("10gbps"), 1.25e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1Gbit"), 1.25e8);
  EXPECT_DOUBLE_EQ(parse_bandwidth("100Mbit"), 1.25e7);
  EXPECT_DOUBLE_EQ(parse_bandwidth("8Kbit"), 1e3);
  EXPECT_DOUBLE_EQ(parse_bandwidth("800bit/s"), 100);
  EXPECT_DOUBLE_EQ(parse_bandwidth("2.5GB/s"), 2.5e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("10GB/s"), 1e10);
  EXPECT_DOUBLE_EQ(parse_bandwidth("500MB/s"), 5e8);
  EXPECT_DOUBLE_EQ(parse_bandwidth("800KB/s"), 8e5);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1e9B/s"), 1e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1TB"), 1e12);
  EXPECT_DOUBLE_EQ(parse_bandwidth("10 Gbit/s"), 1.25e9);  // what describe() prints
}

TEST(ModelledLinkParse, BandwidthRejectsBadText) {
  for (const char* bad : {"", "fast", "10", "0Gbit", "0B/s", "-1GB/s", "-10Gbit", "inf", "infGB/s", "nanGB/s",
                          "10Xbit", "10Gb", "10GB/s/s", "GB/s", "1e999B/s", "+10Gbit",
                          "1e-300bit", "0.1bit", "1e300Tbit"}) {  // positive, but no rate: inf times
    try {
      parse_bandwidth(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'" + std::string(bad) + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("10Gbit"), std::string::npos) << what;
    }
  }
}

TEST(ModelledLinkParse, LatencyExactValues) {
  EXPECT_EQ(parse_latency("50us"), 50us);
  EXPECT_EQ(parse_latency("50\xc2\xb5s"), 50us);  // micro sign
  EXPECT_EQ(parse_latency("50\xce\xbcs"), 50us);  // Greek mu
  EXPECT_EQ(parse_latency("1ms"), 1ms);
  EXPECT_EQ(parse_latency("1.5ms"), 1500us);
  EXPECT_EQ(parse_latency("0"), 0ns);
  EXPECT_EQ(parse_latency("0us"), 0ns);
  EXPECT_EQ(parse_latency("2s"), 2s);
  EXPECT_EQ(parse_latency("100ns"), 100ns);
  EXPECT_EQ(parse_latency("50 us"), 50us);  // what describe() prints
}

TEST(ModelledLinkParse, LatencyRejectsBadText) {
  for (const char* bad :
       {"", "soon", "50", "-1ms", "-0", "1h", "10 parsecs", "infus", "nanms", "ms", "1e30s"}) {
    try {
      parse_latency(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'" + std::string(bad) + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("50us"), std::string::npos) << what;
    }
  }
}

TEST(ModelledLinkModel, EnabledAndDescribe) {
  EXPECT_FALSE(LinkModel{}.enabled());
  EXPECT_TRUE(LinkModel{.bytes_per_second = 1}.enabled());
  EXPECT_TRUE(LinkModel{.latency = 1ns}.enabled());
  EXPECT_EQ((LinkModel{.bytes_per_second = 1.25e9, .latency = 50us}.describe()), "10 Gbit/s, 50 us");
  EXPECT_EQ((LinkModel{.bytes_per_second = 2.5e9, .latency = 1500us}.describe()), "20 Gbit/s, 1.5 ms");
  EXPECT_EQ((LinkModel{.latency = 2s}.describe()), "unlimited bandwidth, 2 s");
  EXPECT_EQ((LinkModel{.bytes_per_second = 1.25e7}.describe()), "100 Mbit/s, 0 us");
  EXPECT_EQ(LinkModel{}.describe(), "no modelled delay");
}

TEST(ModelledLinkGroup, DisabledModelReturnsTheGroupUnchanged) {
  auto group = make_thread_group({.world_size = 3});
  std::vector<Communicator*> before;
  for (auto& c : group) before.push_back(c.get());
  auto after = with_modelled_link(std::move(group), {});
  ASSERT_EQ(after.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(after[r].get(), before[r]);
}

TEST(ModelledLinkGroup, RejectsAGroupOutOfOrderAndABadModel) {
  auto group = make_thread_group({.world_size = 2});
  std::swap(group[0], group[1]);
  EXPECT_THROW(with_modelled_link(std::move(group), {.latency = 1us}), InvalidArgument);
  EXPECT_THROW(with_modelled_link(make_thread_group({.world_size = 2}), {.bytes_per_second = -1}),
               InvalidArgument);
  EXPECT_THROW(with_modelled_link(make_thread_group({.world_size = 2}), {.latency = -1us}), InvalidArgument);
  // Refused, the group is still the caller's; two of three ranks are named as such.
  auto three = make_thread_group({.world_size = 3});
  three.pop_back();
  try {
    with_modelled_link(std::move(three), {.latency = 1us});
    ADD_FAILURE() << "a group missing a rank was wrapped";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("entry 0 of the 2 given is rank 0 of a group of 3"), std::string::npos)
        << e.what();
  }
  ASSERT_EQ(three.size(), 2u);
  EXPECT_NE(three[0], nullptr);
  EXPECT_EQ(three[1]->rank(), 1);
}

// One message each way: each takes latency + bytes / bandwidth.
TEST(ModelledLinkTiming, PingPongPaysLatencyAndBandwidth) {
  constexpr std::size_t kBytes = 1'000'000;
  const LinkModel link{.bytes_per_second = 1e9, .latency = 1ms};  // 1 MB: 1 ms on the wire + 1 ms
  auto comms = linked_group(2, link);
  Clock::time_point start, arrived, returned;
  rethrow_first(run_group(comms, [&](Communicator& comm) {
    std::vector<std::byte> buf(kBytes);
    if (comm.rank() == 0) {
      for (std::size_t i = 0; i < kBytes; ++i) buf[i] = std::byte(i % 251);
      start = Clock::now();
      send(comm, 1, 0, buf);
      recv(comm, 1, 1, buf);
      returned = Clock::now();
      for (std::size_t i = 0; i < kBytes; ++i) ASSERT_EQ(buf[i], std::byte(i % 251 + 1)) << i;
    } else {
      recv(comm, 0, 0, buf);
      arrived = Clock::now();
      for (auto& b : buf) b = std::byte(std::to_integer<int>(b) + 1);
      send(comm, 0, 1, buf);
    }
  }));
  EXPECT_GE(arrived - start, 2ms);
  EXPECT_GE(returned - start, 4ms);
}

// A rank's one outgoing link carries one transfer at a time, whatever the peer.
TEST(ModelledLinkTiming, SendsOnOneLinkAreSerialised) {
  constexpr std::size_t kBytes = 1'000'000;  // 1 ms each at 1 GB/s
  const LinkModel link{.bytes_per_second = 1e9};
  auto comms = linked_group(3, link);
  Clock::time_point start;
  std::vector<Clock::time_point> arrived(3);  // [1]: first to rank 1, [0]: second to rank 1, [2]: to rank 2
  rethrow_first(run_group(comms, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      std::vector<std::byte> a(kBytes, std::byte{1}), b(kBytes, std::byte{2}), c(kBytes, std::byte{3});
      start = Clock::now();
      auto wa = comm.isend(1, 7, a);
      auto wb = comm.isend(1, 7, b);  // same pair, same tag: matched in order
      auto wc = comm.isend(2, 7, c);  // another peer, same link
      wa->wait(comm.timeout());
      wb->wait(comm.timeout());
      wc->wait(comm.timeout());
      EXPECT_GE(Clock::now() - start, 3ms);  // the sender's wait lasts until its link is free
    } else {
      std::vector<std::byte> buf(kBytes);
      recv(comm, 0, 7, buf);
      arrived[comm.rank()] = Clock::now();
      EXPECT_EQ(buf.front(), std::byte(comm.rank() == 1 ? 1 : 3));
      if (comm.rank() == 1) {
        recv(comm, 0, 7, buf);
        arrived[0] = Clock::now();
        EXPECT_EQ(buf.back(), std::byte{2});
      }
    }
  }));
  EXPECT_GE(arrived[1] - start, 1ms);
  EXPECT_GE(arrived[0] - start, 2ms);
  EXPECT_GE(arrived[2] - start, 3ms);
}

// Every algorithm gives exact results through the wrapper.
TEST(ModelledLinkAllreduce, EveryAlgorithmIsExact) {
  const LinkModel link{.bytes_per_second = 1e10, .latency = 20us};
  for (int n : {1, 2, 3, 5}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t(n + 1), std::size_t{1000}}) {
      for (auto algorithm :
           {Algorithm::Auto, Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Naive}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " count=" + std::to_string(count) + " " +
                     to_string(algorithm));
        auto comms = linked_group(n, link);
        rethrow_first(run_group(comms, [&](Communicator& comm) {
          std::vector<float> data(count);
          for (std::size_t i = 0; i < count; ++i) data[i] = float((comm.rank() + 1) * (i % 5 + 1));
          allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = algorithm});
          for (std::size_t i = 0; i < count; ++i)
            ASSERT_EQ(data[i], float((i % 5 + 1) * n * (n + 1) / 2)) << i;
        }));
      }
    }
  }
}

// 2(N-1) rounds, each a chunk's latency + transfer, and the same bytes as unwrapped.
TEST(ModelledLinkAllreduce, RingPaysEveryRoundAndCountsTheSameBytes) {
  constexpr int kRanks = 4;
  constexpr std::size_t kCount = std::size_t{1} << 18;  // 1 MiB of floats; chunk 256 KiB
  const LinkModel link{.bytes_per_second = 1e9, .latency = 1ms};
  const auto chunk_time = std::chrono::nanoseconds(kCount / kRanks * sizeof(float));  // at 1 GB/s
  const auto bound = 2 * (kRanks - 1) * (link.latency + chunk_time);

  std::vector<CommStats> stats(kRanks), plain_stats(kRanks);
  std::vector<Clock::time_point> starts(kRanks), ends(kRanks);
  auto body = [&](Communicator& comm, bool timed) {
    std::vector<float> data(kCount);
    for (std::size_t i = 0; i < kCount; ++i) data[i] = float(comm.rank() + i % 3);
    const auto start = Clock::now();
    allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring});
    if (timed) {
      starts[comm.rank()] = start;
      ends[comm.rank()] = Clock::now();
    }
    for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(data[i], float(6 + 4 * (i % 3))) << i;
  };
  auto comms = linked_group(kRanks, link);
  rethrow_first(run_group(comms, [&](Communicator& comm) { body(comm, true); }));
  auto plain = make_thread_group({.world_size = kRanks});
  rethrow_first(run_group(plain, [&](Communicator& comm) { body(comm, false); }));

  // Rank r's last message comes at the end of a chain of 2(N-1) messages
  // begun by some rank, so it arrives at least `bound` after the first start.
  const auto first_start = *std::min_element(starts.begin(), starts.end());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GE(ends[r] - first_start, bound) << "rank " << r;
    const CommStats s = comms[r]->stats();
    const CommStats p = plain[r]->stats();
    EXPECT_EQ(s.bytes_sent, 2u * (kRanks - 1) * (kCount / kRanks) * sizeof(float)) << "rank " << r;
    EXPECT_EQ(s.bytes_sent, p.bytes_sent) << "rank " << r;
    EXPECT_EQ(s.bytes_received, p.bytes_received) << "rank " << r;
    EXPECT_EQ(s.messages_sent, p.messages_sent) << "rank " << r;
  }
  EXPECT_EQ(comms[0]->native_allreduce(), nullptr);
}

// Over a point-to-point backend the fingerprint check is a message, and it pays the link.
TEST(ModelledLinkAllreduce, FingerprintCheckPaysTheLinkOverPointToPoint) {
  constexpr int kRanks = 3;
  auto inner = make_thread_group({.world_size = kRanks, .timeout = 10s});
  std::vector<std::unique_ptr<Communicator>> p2p;
  for (auto& c : inner) p2p.push_back(std::make_unique<testing::PointToPointOnly>(*c));
  auto comms = with_modelled_link(std::move(p2p), {.latency = 20ms});
  std::vector<Clock::time_point> starts(kRanks), ends(kRanks);
  rethrow_first(run_group(comms, [&](Communicator& comm) {
    starts[comm.rank()] = Clock::now();
    comm.check_fingerprint(Fingerprint{.count = 10});
    ends[comm.rank()] = Clock::now();
  }));
  const auto first_start = *std::min_element(starts.begin(), starts.end());
  for (int r = 0; r < kRanks; ++r) EXPECT_GE(ends[r] - first_start, 20ms) << "rank " << r;
}

// A transfer of 20 s (1000 bytes at 50 B/s): an abort elsewhere wakes both ends.
TEST(ModelledLinkFailure, AbortWakesAModelledSleep) {
  auto comms = linked_group(3, {.bytes_per_second = 50}, 60s);
  auto errors = run_group(
      comms,
      [&](Communicator& comm) {
        std::vector<std::byte> buf(1000);
        if (comm.rank() == 0) send(comm, 1, 0, buf);
        if (comm.rank() == 1) recv(comm, 0, 0, buf);
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(50ms);
          comm.abort("rank 2 gave up");
        }
      },
      5s);
  for (int r : {0, 1}) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " finished normally";
    EXPECT_THROW(std::rethrow_exception(errors[r]), CommAborted) << "rank " << r;
    EXPECT_NE(message_of(errors[r]).find("rank 2 gave up"), std::string::npos) << message_of(errors[r]);
  }
  EXPECT_FALSE(errors[2]);
}

// A delivery beyond the wait's timeout fails at once, names the delay, and aborts the group.
TEST(ModelledLinkFailure, TimeoutShorterThanTheModelledDelay) {
  auto comms = linked_group(2, {.latency = 10s}, 100ms);
  auto errors = run_group(
      comms,
      [&](Communicator& comm) {
        std::vector<std::byte> buf(64);
        if (comm.rank() == 0) {
          send(comm, 1, 0, buf);  // the link is free at once: latency comes after
          comm.irecv(1, 1, buf)->wait(std::chrono::seconds(10));  // never sent: only the abort ends it
        } else {
          recv(comm, 0, 0, buf);
        }
      },
      5s);
  ASSERT_TRUE(errors[1]);
  EXPECT_THROW(std::rethrow_exception(errors[1]), TimeoutError);
  const std::string what = message_of(errors[1]);
  EXPECT_NE(what.find("rank 1: recv from rank 0 timed out after 100 ms (tag 0)"), std::string::npos) << what;
  EXPECT_NE(what.find("modelled link (unlimited bandwidth, 10 s)"), std::string::npos) << what;
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), CommAborted);
  EXPECT_NE(message_of(errors[0]).find("timed out"), std::string::npos) << message_of(errors[0]);
}

// Inside a collective, a receive that times out names the collective too
// ("recv ... timed out (collective seq 0, round 0)" alone did not say which).
TEST(ModelledLinkFailure, ATimeoutInsideACollectiveNamesTheCollective) {
  auto comms = linked_group(2, {.latency = 10s}, 100ms);
  auto errors = run_group(
      comms,
      [&](Communicator& comm) {
        std::vector<float> v(1024, 1.0f);
        allreduce(comm, v, {.op = ReduceOp::Sum, .algorithm = Algorithm::Ring});
      },
      5s);
  bool named = false;
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    const std::string what = message_of(e);
    if (what.find("timed out after 100 ms") == std::string::npos) continue;
    EXPECT_NE(what.find("allreduce(sum, float32, 1024 elements, seq 0, ring)"), std::string::npos) << what;
    EXPECT_NE(what.find("(collective seq 0, round "), std::string::npos) << what;
    named = true;
  }
  EXPECT_TRUE(named) << "no rank timed out";
}

// Note [A dropped transfer aborts the modelled group]: a receive dropped
// before its message came used to shift the channel's numbering, and the next
// receive failed an internal check ("a completed receive has no modelled
// delivery time"); a dropped send left a stale delivery time. Now both abort
// the group, naming the transfer, and every rank's next call fails with it. A
// transfer that completed may be dropped unwaited.
TEST(ModelledLinkFailure, ADroppedTransferAbortsTheGroup) {
  for (const bool drop_send : {false, true}) {
    auto comms = linked_group(2, {.latency = std::chrono::microseconds(10)}, 10s);
    std::atomic<bool> dropped{false};
    auto errors = run_group(
        comms,
        [&](Communicator& comm) {
          std::vector<std::byte> buf(16);
          const int sender = drop_send ? 0 : 1;  // the rank that drops
          if (comm.rank() == sender) {
            { auto w = drop_send ? comm.isend(1, 9, buf) : comm.irecv(0, 9, buf); }  // dropped
            dropped = true;
            (drop_send ? comm.isend(1, 9, buf) : comm.irecv(0, 9, buf))->wait(comm.timeout());
          } else {
            while (!dropped) std::this_thread::yield();
            (drop_send ? comm.irecv(0, 9, buf) : comm.isend(1, 9, buf))->wait(comm.timeout());
          }
        },
        5s);
    for (int r : {0, 1}) {
      ASSERT_TRUE(errors[r]) << "drop_send " << drop_send << ", rank " << r << " finished normally";
      EXPECT_THROW(std::rethrow_exception(errors[r]), CommAborted) << message_of(errors[r]);
      EXPECT_NE(message_of(errors[r]).find("was dropped before it completed"), std::string::npos)
          << message_of(errors[r]);
    }
  }
  // Completed, then dropped without wait(): no harm.
  auto comms = linked_group(2, {.latency = std::chrono::microseconds(10)}, 10s);
  rethrow_first(run_group(comms, [&](Communicator& comm) {
    std::vector<std::byte> buf(16);
    for (int i = 0; i < 3; ++i) {
      if (comm.rank() == 0) {
        auto w = comm.isend(1, 9, buf);
        while (!w->done()) std::this_thread::yield();
      } else {
        auto w = comm.irecv(0, 9, buf);
        while (!w->done()) std::this_thread::yield();
      }
    }
    barrier(comm);
  }));
}

}  // namespace
}  // namespace lockstep::comm
