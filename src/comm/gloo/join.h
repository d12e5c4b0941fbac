// Private: the join protocol of a Gloo process group, on the rendezvous store.
//
//   1. Rank r writes "rank/<r>" = "<nonce> <world size> <host> <pid> <pid
//      space> <build>" unless the key exists, then reads it back: a value with another
//      nonce means another process holds rank r -> InvalidArgument, at once;
//      unless that process was in this boot and pid namespace and has exited
//      (a rank killed during an earlier join): then rank r takes the claim
//      over, removing its "addr/<r>" too.
//   2. It writes "world_size" = "<N> <r> <nonce>" unless it exists, and reads
//      it back: another N -> InvalidArgument naming both ranks, at once;
//      unless the claim that wrote it is gone (an earlier job's): then it is
//      written anew, once.
//   3. It polls until every "rank/<i>" is there (checking each one's world
//      size and build as it appears: another -> InvalidArgument naming both,
//      at once; a claim of an exited process counts as missing) or the
//      deadline passes -> TimeoutError listing the missing ranks by number.
//      Its own claim must still be its own. A rank that times out here (or
//      later in its rendezvous) writes "gave_up/<r>" = "<wall ms> gave up",
//      which its rank's next claim removes (Note [A rank that gave up]).
// A rank refused in 1, 2 or 3 (or failing in them for another reason but a
// timeout) also writes "abort", so the ranks already waiting in 3 are refused
// at once too instead of timing out. A build refusal also writes
// "abort/<rank 0's nonce>": a rank of a build from before builds were
// compared leaves the join once every claim is there, and then polls only
// that key (Note [One build per group]). Once every rank has joined, the group's
// session is rank 0's nonce, and any later failure writes "abort/<session>"
// (first writer wins): a rank whose connection breaks reads it to learn why.
//
// Note [Aborts do not outlive their job]: a job that fails must not stop the
// next one that uses the same store and job id. An abort during training
// goes under the session's own key, which a later job (another rank 0 nonce)
// never reads. An abort during the join or the connect ("abort") must still
// stop the ranks of the same job that have not arrived yet, so it stays, but
// only for kAbortFreshFor: a joiner that finds it older than that, with no
// live claim left (claims of exited processes do not count), removes it and
// joins. A rank leaving the join by failure withdraws its claim, and the last
// claimant to go removes "world_size"; a store that stopped answering gets
// no such clean-up (each call would wait the whole timeout again). A claim of
// a process that was killed stays until the next job's rank of that number
// on the same host takes it over (1); from another host its process cannot
// be checked, and it is refused as claimed twice. Every abort value carries
// its writer's wall-clock time.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "store.h"

namespace lockstep::comm::gloo_backend {

using Clock = std::chrono::steady_clock;

// How long an abort written during the join or connect stops joiners
// (Note [Aborts do not outlive their job]).
inline constexpr std::chrono::seconds kAbortFreshFor{3};

// Joins rank `rank` of `world_size`; returns once every rank has joined, with
// the store's session set, each rank's host name (by rank). A rank whose
// claim states another `build` (ProcessGroupOptions::build, no spaces) is
// refused. On failure this rank's claim is withdrawn first.
std::vector<std::string> join(RendezvousStore& store, int rank, int world_size,
                              std::chrono::milliseconds timeout, Clock::time_point deadline,
                              const std::string& build);

// Best effort: records `reason` as the group's abort reason (store.abort_key())
// unless one is there. Never throws.
void publish_abort(RendezvousStore& store, const std::string& reason) noexcept;
// The group's abort reason, if a rank recorded one. Never throws.
std::optional<std::string> read_abort(RendezvousStore& store) noexcept;

// Removes this rank's join keys (its claim and addresses); the last rank of
// the group to leave also removes "world_size" ("abort" stays until it is
// kAbortFreshFor old: Note [Aborts do not outlive their job]). Called once every
// rank has connected to every other (so all have read them), and by a rank
// that fails after the join, so that a later job with the same id and store
// starts clean. Never throws.
void leave(RendezvousStore& store, int rank, int world_size) noexcept;

// leave() for a rank whose rendezvous timed out after its join (waiting for a
// peer's addresses or connection): first records that it gave up, for a rank
// held up past its own deadline to name it as such (Note [A rank that gave
// up]). Never throws.
void leave_timed_out(RendezvousStore& store, int rank, int world_size) noexcept;

// Note [A rank that gave up] (join.cpp): of `ranks`, those whose last record of
// giving up is at or after `since_ms` (wall-clock ms; 0: any record) are
// taken out of `ranks` and named in the returned phrase, "rank 0 of 2 DONE and
// gave up waiting 3 s ago, ..."; "" if none. Throws what the store throws.
std::string gave_up_since(RendezvousStore& store, std::vector<int>& ranks, long long since_ms, int world_size,
                          const std::string& done);

// leave() for a rank that failed after its join: first records `reason` for
// the group (its session's abort) and for the ranks that may still be in
// their join ("abort", which they poll: a peer that never saw this rank's
// claim before it was withdrawn would otherwise wait for it until its
// deadline). Never throws.
void leave_failed(RendezvousStore& store, int rank, int world_size, const std::string& reason) noexcept;

// Whether rank `rank`'s claim is held by a process of this boot and pid
// namespace that has exited (killed or crashed after it joined). False for a
// live process, another host's (it cannot be checked), or no claim. Never throws.
bool claim_holder_exited(RendezvousStore& store, int rank) noexcept;

// Throws the rendezvous refusal recorded in the store, if any (InvalidArgument
// for a refusal during the join, CommAborted for any other abort).
void throw_if_aborted(RendezvousStore& store, int rank);

}  // namespace lockstep::comm::gloo_backend
