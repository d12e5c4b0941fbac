// Private: starting a collective (sequence number, fingerprint) and checking
// that every rank makes the same call.
#pragma once

#include "lockstep/comm/collectives.h"

namespace lockstep::comm::detail {

// Tags with the top bit set are the library's own channels, never a collective's round.
inline constexpr std::uint64_t kFingerprintTag = std::uint64_t{1} << 63;

// Fails at once on an aborted communicator; otherwise numbers the call.
Fingerprint start_collective(Communicator& comm, CollectiveKind kind, ReduceOp op, DataType dtype,
                             std::uint64_t count, int root = -1);

[[noreturn]] void fingerprint_mismatch(Communicator& comm, int other_rank, const Fingerprint& mine,
                                       const Fingerprint& theirs);

}  // namespace lockstep::comm::detail
