// Exactly-once data accounting: did the replicas, together, read every
// sample of the plan once, no sample twice, and none that was not planned?
//
// Each replica keeps a tally of the sample indices it read: a count and an
// order-independent sum of a 64-bit mix of each index. The tallies are
// gathered (a few words per rank, riding on the divergence detector's
// gather), summed, and compared with the tally of what the sampler planned
// for the same steps, which every replica computes on its own. The card's
// classic bug, every replica drawing its shard with the same seed, shows up
// as replicas with identical tallies and a total that is not the plan's.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace lockstep::ddp {

struct SampleTally {
  std::uint64_t count = 0;
  std::uint64_t sum = 0;  // sum of mix(index) mod 2^64; any order gives the same sum

  void add(std::int64_t sample_index);
  SampleTally& operator+=(const SampleTally& other);
  bool operator==(const SampleTally&) const = default;
};

// Pure. `per_rank[r]` is what rank r read in a window of steps, `planned`
// what the sampler assigned to the whole group in that window. Returns
// nullopt if they agree, else one or two sentences naming the problem (and
// the ranks that read identical samples, if any). A wrong sum passes only if
// two different multisets of indices collide in 64 bits.
std::optional<std::string> audit_samples(std::span<const SampleTally> per_rank, const SampleTally& planned);

}  // namespace lockstep::ddp
