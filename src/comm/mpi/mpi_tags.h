// Private: our 64-bit tags in MPI's tag space [0, MPI_TAG_UB].
//
// A lockstep tag is (sequence << 16 | round) under bit 62 for round `round`
// of collective number `sequence`, a library channel with the top bit set
// (the fingerprint ring), or a program's own below 2^62 (tags.h). MPI tags are ints, at
// most MPI_TAG_UB (2^31 - 1 in OpenMPI's ob1; the standard promises only
// 2^15 - 1), so the sequence number is kept modulo a window W:
//
//   MPI tag = slot << 16 | round,  slot = 1 + sequence mod (W - 1),
//                                  (bit 62 dropped; a program's tag t
//                                  folds as sequence t >> 16, round t & 0xffff)
//                                  W = (MPI_TAG_UB + 1) >> 16  (32768 in ob1)
//   slot 0 holds the library channels: round 0 the fingerprint ring, and
//   0xffff this backend's abort notices.
//
// Note [Tags in a window]: two messages are confused only if both are in
// flight at once between the same pair of ranks, on the same communicator,
// with the same MPI tag but different lockstep tags. They cannot be:
//   - Same lockstep tag, same pair: MPI's non-overtaking rule matches them in
//     the order they were posted, which is the order the interface promises.
//   - Same collective, different rounds: different `round`, kept exactly
//     (16 bits, as make_tag keeps it).
//   - Different collectives: their sequence numbers differ by less than W - 1
//     while both can be in flight. A rank runs its collectives one after
//     another and waits for all its own receives before it starts the next,
//     and every send of a collective is matched by a receive of the same
//     collective; so a message of collective s to rank B can be unmatched
//     only while B has not finished s. Its sender is then at most N - 1
//     collectives ahead of B: every collective (with a fingerprint check)
//     completes on rank r only after r received rank r-1's fingerprint of
//     that call, so rank r-1 had entered it; by induction over the ring, when
//     any rank is in collective c every rank has entered c - (N - 1). An
//     all-reduce without the check (verify = false) depends on every rank's
//     data, which is a stronger bound. Hence a window larger than the world
//     size is enough: connect_mpi refuses a group with N >= W - 1.
//   - The fingerprint ring has one tag for every call and relies on MPI's
//     ordering alone, as it does on every backend.
//   - MPI_Iallreduce (the native all-reduce) runs in MPI's collective
//     context of the same communicator, which never matches point-to-point
//     messages.
// A program that calls isend/irecv with tags of its own must keep the same
// rule: two tags in flight between one pair at once differ modulo 2^16 (W - 1).
#pragma once

#include <cstdint>
#include <string>

#include "../tags.h"
#include "lockstep/error.h"

namespace lockstep::comm::detail {

inline constexpr int kAbortNoticeMpiTag = 0xffff;  // slot 0, round 0xffff

// The number of sequence slots available under `tag_ub` (MPI_TAG_UB).
inline std::uint64_t mpi_tag_window(int tag_ub) {
  return (static_cast<std::uint64_t>(tag_ub) + 1) >> 16;
}

// The MPI tag of lockstep tag `tag` (see above). `window` = mpi_tag_window(tag_ub) >= 2.
inline int to_mpi_tag(std::uint64_t tag, std::uint64_t window) {
  const std::uint64_t round = tag & 0xffffu;
  if (tag & kLibraryChannelBit) {
    const std::uint64_t channel = tag & ~kLibraryChannelBit;
    LOCKSTEP_CHECK(channel < 0xffffu, "library channel tags are 0 .. 0xfffe");
    return static_cast<int>(channel);
  }
  const std::uint64_t slot = 1 + ((tag & ~kCollectiveTagBit) >> 16) % (window - 1);
  return static_cast<int>(slot << 16 | round);
}


}  // namespace lockstep::comm::detail
