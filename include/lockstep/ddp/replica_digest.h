// Digests of replica state, compared across ranks.
//
// The card's invariant is that every replica holds identical weights and
// optimizer state at the start of every step. These are the two pieces that
// check it without moving the state itself: a 64-bit digest of a byte span,
// and a collective that compares every rank's list of digests and names the
// fields and ranks that differ from the majority.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.h"

namespace lockstep::ddp {

// A 64-bit digest of `bytes` (four xxHash64-style lanes over 8-byte words,
// then an avalanche). Any change confined to one 8-byte word (one flipped
// bit, one replaced float) always changes the digest, because every round is
// a bijection of the lane; other changes go unnoticed only by accident.
// Reads the span once at memory speed. Pure: the same bytes give the same
// digest on every rank and every run.
std::uint64_t digest(std::span<const std::byte> bytes);
inline std::uint64_t digest(std::span<const float> values) {
  return digest(std::as_bytes(values));
}

// Field `field` differs between ranks: `ranks` hold another digest than
// `majority`, the largest group of ranks with equal digests. When another
// group is as large (two replicas that disagree, a 2-2 split), `tie` is set:
// `majority` is then only the group with the lowest rank, and nothing says
// which side is right.
struct DigestMismatch {
  std::size_t field = 0;
  std::vector<int> ranks;     // ascending
  std::vector<int> majority;  // ascending
  bool tie = false;
};

// Collective: every rank passes its digests of the same fields in the same
// order (the same count everywhere; another count aborts the group through
// the all-reduce's fingerprint check). Returns every field where some rank
// differs, in field order; empty if all agree. Every rank gets the same
// answer, so every rank takes the same branch on it.
// Cost: one all-reduce of N x fields x 4 floats (each rank fills its own row
// of a zeroed table with 16-bit pieces of its digests, exact in float, and a
// sum gathers the rows). Blocks at most the communicator's timeout.
std::vector<DigestMismatch> compare_across_ranks(comm::Communicator& comm,
                                                 std::span<const std::uint64_t> digests);

// The two halves of compare_across_ranks, for callers that gather more than
// digests in the same call. gather_words: collective, returns the N x
// words.size() table (rank-major) of every rank's words, exactly; same cost
// as above. find_mismatches: pure, over `fields` of the table's columns
// [first, first + fields).
std::vector<std::uint64_t> gather_words(comm::Communicator& comm, std::span<const std::uint64_t> words);
std::vector<DigestMismatch> find_mismatches(std::span<const std::uint64_t> table, int world_size,
                                            std::size_t first, std::size_t fields);

// A rank that is in the majority for every mismatch (the lowest), or -1 if
// there is none, or if any mismatch is a tie (no majority to trust). The
// rank to repair the others from.
int healthy_rank(std::span<const DigestMismatch> mismatches, int world_size);

// "rank 3" or "ranks 1, 5 and 6".
std::string describe_ranks(std::span<const int> ranks);

}  // namespace lockstep::ddp
