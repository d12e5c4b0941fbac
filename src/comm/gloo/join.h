// Private: the join protocol of a Gloo process group, on the rendezvous store.
//
//   1. Rank r writes "rank/<r>" = "<nonce> <world size> <host> <pid>" unless
//      the key exists, then reads it back: a value with another nonce means
//      another process holds rank r -> InvalidArgument, at once.
//   2. It writes "world_size" = "<N> <r>" unless it exists, and reads it back:
//      another N -> InvalidArgument naming both ranks, at once.
//   3. It polls until every "rank/<i>" is there (checking each one's world
//      size as it appears) or the deadline passes -> TimeoutError listing the
//      missing ranks by number.
// A rank refused in 1 or 2 also writes "abort", so the ranks already waiting
// in 3 are refused at once too instead of timing out. Any later failure of
// the group writes "abort" as well (first writer wins): a rank whose
// connection breaks reads it to learn why.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "store.h"

namespace lockstep::comm::gloo_backend {

using Clock = std::chrono::steady_clock;

inline constexpr const char* kAbortKey = "abort";

// Joins rank `rank` of `world_size`; returns once every rank has joined.
void join(RendezvousStore& store, int rank, int world_size, std::chrono::milliseconds timeout,
          Clock::time_point deadline);

// Best effort: records `reason` as the group's abort reason unless one is there. Never throws.
void publish_abort(RendezvousStore& store, const std::string& reason) noexcept;
// The group's abort reason, if a rank recorded one. Never throws.
std::optional<std::string> read_abort(RendezvousStore& store) noexcept;

// Once every rank has connected to every other (so all have read them),
// removes this rank's join keys, so that a later job with the same id and
// store starts clean. A failed job leaves its keys (the abort reason among
// them): the next one needs a fresh rendezvous directory or job id.
void leave(RendezvousStore& store, int rank);

// Throws the rendezvous refusal recorded in the store, if any (InvalidArgument
// for a refusal during the join, CommAborted for any other abort).
void throw_if_aborted(RendezvousStore& store, int rank);

}  // namespace lockstep::comm::gloo_backend
