// Private: the message tags the library itself uses, and how errors name a tag.
//
// One 64-bit tag space is shared by the library and programs that call
// isend/irecv themselves (communicator.h). The library keeps the top two bits:
//   bit 63: library channels (the fingerprint ring is channel 0);
//   bit 62: collectives, (sequence << 16 | round) under the bit.
// So a tag below 2^62 is always a program's own, and an error can say which
// kind of message it was waiting for.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::comm::detail {

inline constexpr std::uint64_t kLibraryChannelBit = std::uint64_t{1} << 63;
inline constexpr std::uint64_t kCollectiveTagBit = std::uint64_t{1} << 62;
inline constexpr std::uint64_t kFingerprintTag = kLibraryChannelBit;  // channel 0

// Tag of round `round` of collective number `sequence` (sequence < 2^46).
inline std::uint64_t make_tag(std::uint64_t sequence, std::uint32_t round) {
  return kCollectiveTagBit | (sequence << 16 & ~(kLibraryChannelBit | kCollectiveTagBit)) | (round & 0xffffu);
}

// For error messages: "collective seq 12, round 3", "fingerprint check",
// "library channel 2", or a program's own "tag 7".
inline std::string describe_tag(std::uint64_t tag) {
  if (tag == kFingerprintTag) return "fingerprint check";
  if (tag & kLibraryChannelBit) return "library channel " + std::to_string(tag & ~kLibraryChannelBit);
  if (tag & kCollectiveTagBit) {
    return "collective seq " + std::to_string((tag & ~kCollectiveTagBit) >> 16) + ", round " +
           std::to_string(tag & 0xffff);
  }
  return "tag " + std::to_string(tag);
}

}  // namespace lockstep::comm::detail
