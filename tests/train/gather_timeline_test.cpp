// gather_timeline(): every rank's events on rank 0, moved onto rank 0's clock.
// The ranks here are threads of a thread group, each given its own zero, as
// processes on different machines have; tests/cli/launch_train_test.cpp
// draws a real multi-process run.
#include "train/gather_timeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "comm/run_ranks.h"
#include "lockstep/comm/modelled_link.h"
#include "lockstep/error.h"

namespace lockstep::train {
namespace {

using Clock = std::chrono::steady_clock;

double us_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

TEST(GatherTimeline, EventsSurviveTheWire) {
  const std::vector<TimelineEvent> events = {
      {2, Track::Comm, Phase::Allreduce, 7, "allreduce bucket 1", 12.5, 99.25, 4096, -1},
      {2, Track::Compute, Phase::Backward, 8, "", 100, 100, 0, 3},
      {2, Track::Compute, Phase::Exposed, 1LL << 40, std::string("a\0b \xff", 5), -3, 1e12, ~0ULL, 0}};
  const auto bytes = detail::serialize_events(events);
  const auto back = detail::deserialize_events(bytes);
  ASSERT_EQ(back.size(), events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(back[i].replica, events[i].replica);
    EXPECT_EQ(back[i].track, events[i].track);
    EXPECT_EQ(back[i].phase, events[i].phase);
    EXPECT_EQ(back[i].step, events[i].step);
    EXPECT_EQ(back[i].name, events[i].name);
    EXPECT_EQ(back[i].start_us, events[i].start_us);
    EXPECT_EQ(back[i].end_us, events[i].end_us);
    EXPECT_EQ(back[i].bytes, events[i].bytes);
    EXPECT_EQ(back[i].layer, events[i].layer);
  }
  // Cut anywhere inside the last event: refused, not read past the end.
  for (std::size_t cut = 1; cut < 20; ++cut) {
    EXPECT_THROW(detail::deserialize_events(std::span(bytes).first(bytes.size() - cut)), Error) << cut;
  }
  EXPECT_TRUE(detail::deserialize_events({}).empty());
}

// Rank r's zero is r seconds before rank 0's, so the same moment is r
// seconds later on its clock. Each rank records one event at one shared
// moment; on rank 0 the three must land at the same time.
TEST(GatherTimeline, MovesEveryRankOntoRankZerosClock) {
  const int n = 3;
  const auto base = Clock::now();
  const auto moment = base + std::chrono::milliseconds(5);
  std::vector<std::vector<TimelineEvent>> results(n);
  const auto errors = testing::run_group(
      comm::make_thread_group({.world_size = n, .timeout = std::chrono::seconds(20)}), [&](comm::Communicator& comm) {
        const int r = comm.rank();
        const auto t0 = base - std::chrono::seconds(r);
        std::vector<TimelineEvent> mine = {
            {r, Track::Compute, Phase::Forward, 4, "forward", us_between(t0, moment), us_between(t0, moment) + 250}};
        results[r] = detail::gather_timeline(comm, mine, t0);
      });
  testing::rethrow_first(errors);
  for (int r = 1; r < n; ++r) ASSERT_EQ(results[r].size(), 1u) << "rank " << r << " keeps its own events only";
  const auto& all = results[0];
  ASSERT_EQ(all.size(), std::size_t(n));
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(all[r].replica, r);
    EXPECT_EQ(all[r].name, "forward");
    EXPECT_EQ(all[r].step, 4);
    // Half a round trip between threads at most; without the offset they are r seconds apart.
    EXPECT_NEAR(all[r].start_us, all[0].start_us, 20000.0);
    EXPECT_DOUBLE_EQ(all[r].end_us - all[r].start_us, 250.0);
  }
}

// A rank that started before rank 0 has events before rank 0's zero: the
// timeline then starts at the earliest event, and keeps every interval.
TEST(GatherTimeline, StartsAtTheEarliestEvent) {
  const int n = 2;
  const auto base = Clock::now();
  std::vector<std::vector<TimelineEvent>> results(n);
  const auto errors = testing::run_group(
      comm::make_thread_group({.world_size = n, .timeout = std::chrono::seconds(20)}), [&](comm::Communicator& comm) {
        const int r = comm.rank();
        const auto t0 = base - std::chrono::seconds(r);  // rank 1 started a second earlier
        // Rank 1's event is at its zero, a second before rank 0's zero; rank 0's is 1 ms after its own.
        const double at = r == 0 ? 1000.0 : 0.0;
        results[r] = detail::gather_timeline(
            comm, {{r, Track::Compute, Phase::Optimizer, 0, "optimizer", at, at + 500}}, t0);
      });
  testing::rethrow_first(errors);
  const auto& all = results[0];
  ASSERT_EQ(all.size(), 2u);
  const double first = std::min(all[0].start_us, all[1].start_us);
  EXPECT_EQ(first, 0.0);
  EXPECT_EQ(all[1].start_us, 0.0);
  EXPECT_NEAR(all[0].start_us - all[1].start_us, 1e6 + 1000.0, 20000.0);
  for (const auto& e : all) EXPECT_DOUBLE_EQ(e.end_us - e.start_us, 500.0);
}

// Rank 0 receives the ranks' timelines at once, not one after another: on a
// link where each of 7 timelines takes a second, served in turn rank 7
// waited 6 s for its first probe and failed its 4 s timeout.
TEST(GatherTimeline, NoRankWaitsForTheOthersTimelines) {
  const int n = 8;
  const comm::LinkModel link{.bytes_per_second = 2.5e6, .latency = std::chrono::microseconds(0)};
  const auto t0 = Clock::now();
  std::vector<std::size_t> gathered(n, 0);
  const auto errors = testing::run_group(
      comm::with_modelled_link(comm::make_thread_group({.world_size = n, .timeout = std::chrono::seconds(4)}), link),
      [&](comm::Communicator& comm) {
        // 2.5 MB a rank, 1 s on the link, in few events (long names), so
        // that (de)serialising them is quick, under a sanitizer too.
        std::vector<TimelineEvent> mine(500, {comm.rank(), Track::Compute, Phase::Backward, 1, std::string(5000, 'x'),
                                              0, 1, 0, 0});
        gathered[comm.rank()] = detail::gather_timeline(comm, mine, t0).size();
      });
  testing::rethrow_first(errors);
  EXPECT_EQ(gathered[0], std::size_t(n) * 500);
}

// A rank that does not take part (lost or hung after the last step): rank 0
// times out, and its error names the gather, not only a bare tag ("recv from
// rank 1 timed out after 200 ms (tag 28930)"), and keeps its class.
TEST(GatherTimeline, ARankThatNeverComesIsNamedWithTheGather) {
  std::string rank0_error;
  bool timeout = false;
  const auto errors = testing::run_group(
      comm::make_thread_group({.world_size = 2, .timeout = std::chrono::milliseconds(200)}),
      [&](comm::Communicator& comm) {
        if (comm.rank() != 0) return;  // never comes
        try {
          detail::gather_timeline(comm, {}, Clock::now());
        } catch (const TimeoutError& e) {
          timeout = true;
          rank0_error = e.what();
        } catch (const Error& e) {
          rank0_error = e.what();
        }
      });
  EXPECT_TRUE(timeout) << rank0_error;
  EXPECT_NE(rank0_error.find("gathering every rank's timeline"), std::string::npos) << rank0_error;
  EXPECT_NE(rank0_error.find("rank 1"), std::string::npos) << rank0_error;
}

}  // namespace
}  // namespace lockstep::train
