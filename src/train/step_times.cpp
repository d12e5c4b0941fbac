// The replicas' step times: their medians, and the part of each all-reduce
// spent waiting for the last replica (declared in replica.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "replica.h"
#include "replica_clock.h"

namespace lockstep::train::detail {

StepTimes median_times(std::span<const StepSample> samples) {
  StepTimes t;
  if (samples.empty()) return t;
  // The median of field(s) over the samples where keep(s); NaN if there are none.
  auto median = [&](auto field, auto keep) {
    std::vector<double> v;
    for (const auto& s : samples)
      if (keep(s)) v.push_back(field(s));
    if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const auto every = [](const StepSample&) { return true; };
  t.step_ms = median([](const StepSample& s) { return s.step; }, every);
  t.compute_ms = median([](const StepSample& s) { return s.compute; }, every);
  t.comm_ms = median([](const StepSample& s) { return s.comm; }, every);
  t.exposed_comm_ms = median([](const StepSample& s) { return s.exposed; }, every);
  t.overlap_fraction = median(
      [](const StepSample& s) { return s.comm > 0 ? std::clamp(1.0 - s.exposed / s.comm, 0.0, 1.0) : 0.0; },
      every);
  const double check =
      median([](const StepSample& s) { return s.check; }, [](const StepSample& s) { return s.check > 0; });
  if (!std::isnan(check)) t.check_ms = check;
  const auto attributed = [](const StepSample& s) { return !std::isnan(s.comm_wait); };
  t.comm_wait_ms = median([](const StepSample& s) { return s.comm_wait; }, attributed);
  t.comm_joined_ms = median([](const StepSample& s) { return s.comm - s.comm_wait; }, attributed);
  return t;
}

// Note [Waiting for the last replica]: an all-reduce cannot finish on any
// replica before every replica has started it, so the time from a replica's
// start of all-reduce k of step s to the last replica's start of the same
// all-reduce is waiting, whatever the algorithm: for the others' backward
// (and, with more replicas than cores, for the OS to run them). The rest of
// the span is the all-reduce itself. Each wait is clamped to the replica's
// own span, so wait + joined = comm for every sample.
void attribute_waits(std::span<ReplicaOutput> outputs) {
  if (outputs.empty()) return;
  const std::size_t steps = outputs[0].steps.size();
  for (const auto& o : outputs) {
    if (o.steps.size() != steps) return;
    for (std::size_t s = 0; s < steps; ++s)
      if (o.steps[s].spans.size() != outputs[0].steps[s].spans.size()) return;
  }
  for (std::size_t s = 0; s < steps; ++s) {
    const std::size_t n = outputs[0].steps[s].spans.size();
    for (auto& o : outputs) o.steps[s].comm_wait = 0;
    for (std::size_t k = 0; k < n; ++k) {
      auto last_start = outputs[0].steps[s].spans[k].first;
      for (const auto& o : outputs) last_start = std::max(last_start, o.steps[s].spans[k].first);
      for (auto& o : outputs) {
        const auto [start, end] = o.steps[s].spans[k];
        o.steps[s].comm_wait += ms_between(start, std::min(last_start, end));
      }
    }
  }
}

}  // namespace lockstep::train::detail
