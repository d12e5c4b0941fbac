// Private: a replica's timeline events, kept as they happen (run_replica).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/train/timeline.h"
#include "replica_clock.h"

namespace lockstep::train::detail {

// Records this replica's events against the run's common zero.
class Recorder {
 public:
  Recorder(bool keep, int replica, Clock::time_point t0) : keep_(keep), replica_(replica), t0_(t0) {}
  void add(Track track, Phase phase, std::int64_t step, std::string name, Clock::time_point a,
           Clock::time_point b, std::uint64_t bytes = 0, int layer = -1) {
    if (!keep_) return;
    events_.push_back({replica_, track, phase, step, std::move(name), us(a), us(b), bytes, layer});
  }
  std::vector<TimelineEvent> take() { return std::move(events_); }

 private:
  double us(Clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - t0_).count(); }
  bool keep_;
  int replica_;
  Clock::time_point t0_;
  std::vector<TimelineEvent> events_;
};

}  // namespace lockstep::train::detail
