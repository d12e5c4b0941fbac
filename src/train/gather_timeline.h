// Private: every rank's timeline on rank 0, on rank 0's clock (gather_timeline.cpp).
#pragma once

#include <chrono>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/train/timeline.h"

namespace lockstep::train::detail {

// Collective over a process group, after training (no other message in
// flight): rank 0 gets `mine` followed by every other rank's events, their
// times moved onto rank 0's clock; the other ranks get `mine` back. `t0` is
// the zero each rank's event times count from.
std::vector<TimelineEvent> gather_timeline(comm::Communicator& comm, std::vector<TimelineEvent> mine,
                                           std::chrono::steady_clock::time_point t0);

// Exposed for tests: the events as bytes and back (throws CommAborted on a
// malformed buffer).
std::vector<std::byte> serialize_events(const std::vector<TimelineEvent>& events);
std::vector<TimelineEvent> deserialize_events(std::span<const std::byte> bytes);

}  // namespace lockstep::train::detail
