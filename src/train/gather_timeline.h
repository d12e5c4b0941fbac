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
// the zero each rank's event times count from. Rank 0 holds every rank's
// events; the ranks are served one after another, each wait with the
// communicator's timeout.
std::vector<TimelineEvent> gather_timeline(comm::Communicator& comm, std::vector<TimelineEvent> mine,
                                           std::chrono::steady_clock::time_point t0);

// Throws lockstep::Error for another rank's malformed events or a size over
// 1 GiB, TimeoutError or CommAborted as the communicator does; the caller
// aborts the group with the reason (train_replica does).
//
// Exposed for tests: the events as bytes and back (deserialize_events throws
// lockstep::Error on a malformed buffer).
std::vector<std::byte> serialize_events(const std::vector<TimelineEvent>& events);
std::vector<TimelineEvent> deserialize_events(std::span<const std::byte> bytes);

}  // namespace lockstep::train::detail
