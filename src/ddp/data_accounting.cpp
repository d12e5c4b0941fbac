// Exactly-once accounting (data_accounting.h). The mix is splitmix64's
// finaliser: a bijection of 64-bit words, so distinct indices never share a
// value, and sums of distinct multisets collide only by accident (~2^-64).
#include "lockstep/ddp/data_accounting.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "lockstep/ddp/replica_digest.h"

namespace lockstep::ddp {
namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void SampleTally::add(std::int64_t sample_index) {
  ++count;
  sum += mix(static_cast<std::uint64_t>(sample_index));
}

SampleTally& SampleTally::operator+=(const SampleTally& other) {
  count += other.count;
  sum += other.sum;
  return *this;
}

std::optional<std::string> audit_samples(std::span<const SampleTally> per_rank, const SampleTally& planned) {
  SampleTally total;
  for (const auto& t : per_rank) total += t;
  if (total == planned) return std::nullopt;

  // Ranks that read exactly the same samples as another rank.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<int>> same;
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    if (per_rank[r].count > 0) same[{per_rank[r].count, per_rank[r].sum}].push_back(int(r));
  std::vector<int> twins;
  for (const auto& [tally, ranks] : same)
    if (ranks.size() > 1) twins.insert(twins.end(), ranks.begin(), ranks.end());
  const std::string counts = " (" + std::to_string(total.count) + " samples read, " +
                             std::to_string(planned.count) + " planned)";
  if (!twins.empty()) {
    std::sort(twins.begin(), twins.end());
    return describe_ranks(twins) + " read identical samples" + counts +
           ": the same-seed bug, every replica drew its shard with the same seed. Each replica must take its own "
           "disjoint shard of one global order (a distributed sampler).";
  }
  if (total.count > planned.count)
    return "some samples were read by more than one replica" + counts + "; the shards overlap.";
  if (total.count < planned.count) return "some planned samples were read by no replica" + counts + ".";
  return "the replicas read as many samples as planned but not the planned ones" + counts +
         ": shards overlap and other samples were skipped.";
}

}  // namespace lockstep::ddp
