// The timeline: what every replica did, and when, as recorded events.
//
// Each replica records its own events (no shared state while training); the
// trainer merges them at the end. Two tracks per replica:
//   Compute: "forward", "backward <layer>", "optimizer", and "exposed comm"
//            (the step waiting on communication after backward ended);
//   Comm:    "allreduce bucket <k>" on the reducer's communication thread.
// Times are microseconds since the start of the run (one clock for all; over
// a process group, rank 0's, the other ranks' events moved onto it).
//
// write_chrome_trace() writes Chrome's trace event format (opens in Perfetto
// and chrome://tracing); render_timeline_svg() draws one step itself.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace lockstep::train {

enum class Track { Compute, Comm };

// What an event is, for colouring and for the metrics.
enum class Phase { Forward, Backward, Optimizer, Exposed, Allreduce };

struct TimelineEvent {
  int replica = 0;
  Track track = Track::Compute;
  Phase phase = Phase::Forward;
  std::int64_t step = 0;
  std::string name;  // e.g. "backward 2.weight", "allreduce bucket 0"
  double start_us = 0, end_us = 0;
  std::uint64_t bytes = 0;  // Allreduce: bytes this replica sent for it
  std::int32_t layer = -1;  // Forward/Backward: the model's layer index
};

const char* to_string(Phase phase);

// Writes {"traceEvents": [...], "displayTimeUnit": "ms"} with one complete
// ("ph": "X") event per TimelineEvent, pid 0, one thread per (replica,
// track) named "replica R compute" / "replica R comm". Throws IoError.
void write_chrome_trace(const std::filesystem::path& path, std::span<const TimelineEvent> events,
                        int replicas);

// A self-contained SVG of step `step`: one row per replica with a compute
// lane and a comm lane, bars coloured by phase, the exposed communication
// marked, and a millisecond axis. Throws InvalidArgument if the step has no
// events.
std::string render_timeline_svg(std::span<const TimelineEvent> events, int replicas, std::int64_t step);

}  // namespace lockstep::train
