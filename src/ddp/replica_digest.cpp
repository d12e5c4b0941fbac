// Digests of replica state and their comparison across ranks.
//
// Note [Digest rounds]: each lane takes 8-byte words with the xxHash64 round
//   lane = rotl(lane + word * P2, 31) * P1
// which, for a fixed word, is a bijection of the lane (add, rotate, multiply
// by an odd constant), and for a fixed lane a bijection of the word. So two
// inputs that differ in exactly one word end with different lanes, and the
// final combination (again bijective in each lane while the others are
// equal) keeps them apart: a flipped bit is always seen. Four lanes are
// independent chains, so the loop runs at memory speed rather than at one
// multiply latency per word.
#include "lockstep/ddp/replica_digest.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>

#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"

namespace lockstep::ddp {
namespace {

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr std::uint64_t kP3 = 0x165667B19E3779F9ull;

std::uint64_t round(std::uint64_t lane, std::uint64_t word) {
  return std::rotl(lane + word * kP2, 31) * kP1;
}

std::uint64_t avalanche(std::uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace

std::uint64_t digest(std::span<const std::byte> bytes) {
  std::uint64_t lane[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  const std::byte* p = bytes.data();
  const std::size_t blocks = bytes.size() / 32;
  for (std::size_t b = 0; b < blocks; ++b, p += 32) {
    for (int l = 0; l < 4; ++l) {
      std::uint64_t w;
      std::memcpy(&w, p + 8 * l, 8);
      lane[l] = round(lane[l], w);
    }
  }
  // The tail (< 32 bytes), zero-padded into whole words; the length below
  // tells a padded tail from real zeros.
  const std::size_t rest = bytes.size() - 32 * blocks;
  for (std::size_t off = 0, l = 0; off < rest; off += 8, ++l) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + off, std::min<std::size_t>(8, rest - off));
    lane[l] = round(lane[l], w);
  }
  std::uint64_t h = bytes.size() * kP3;
  for (auto l : lane) h = std::rotl(h ^ avalanche(l), 27) * kP1 + kP3;
  return avalanche(h);
}

std::vector<std::uint64_t> gather_words(comm::Communicator& comm, std::span<const std::uint64_t> words) {
  const std::size_t n = static_cast<std::size_t>(comm.size()), f = words.size();
  // Row r of the table is rank r's words, as 16-bit pieces (exact in
  // float); the other rows are 0 here, so a sum gathers every row.
  std::vector<float> table(n * f * 4, 0.0f);
  float* mine = &table[static_cast<std::size_t>(comm.rank()) * f * 4];
  for (std::size_t i = 0; i < f; ++i)
    for (int p = 0; p < 4; ++p) mine[4 * i + p] = float((words[i] >> (16 * p)) & 0xffff);
  comm::allreduce(comm, table, {.op = comm::ReduceOp::Sum});
  std::vector<std::uint64_t> out(n * f, 0);
  for (std::size_t j = 0; j < n * f; ++j)
    for (int p = 0; p < 4; ++p) out[j] |= std::uint64_t(table[j * 4 + p]) << (16 * p);
  return out;
}

std::vector<DigestMismatch> find_mismatches(std::span<const std::uint64_t> table, int world_size,
                                            std::size_t first, std::size_t fields) {
  if (world_size < 1 || table.size() % static_cast<std::size_t>(world_size) != 0 ||
      first > table.size() / static_cast<std::size_t>(world_size) ||
      fields > table.size() / static_cast<std::size_t>(world_size) - first) {
    throw InvalidArgument("find_mismatches: a table of " + std::to_string(table.size()) + " words is not " +
                          std::to_string(world_size) + " rows with columns [" + std::to_string(first) + ", " +
                          std::to_string(first) + " + " + std::to_string(fields) + ")");
  }
  const std::size_t n = static_cast<std::size_t>(world_size), f = table.size() / n;
  std::vector<DigestMismatch> out;
  for (std::size_t i = first; i < first + fields; ++i) {
    std::map<std::uint64_t, std::vector<int>> groups;  // digest -> ranks holding it
    for (std::size_t r = 0; r < n; ++r) groups[table[r * f + i]].push_back(int(r));
    if (groups.size() == 1) continue;
    const std::vector<int>* best = nullptr;
    for (const auto& [d, ranks] : groups) {
      if (!best || ranks.size() > best->size() || (ranks.size() == best->size() && ranks[0] < (*best)[0]))
        best = &ranks;
    }
    DigestMismatch m{i - first, {}, *best};
    for (const auto& [d, ranks] : groups) {
      if (&ranks == best) continue;
      m.ranks.insert(m.ranks.end(), ranks.begin(), ranks.end());
      m.tie = m.tie || ranks.size() == best->size();
    }
    std::sort(m.ranks.begin(), m.ranks.end());
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<DigestMismatch> compare_across_ranks(comm::Communicator& comm,
                                                 std::span<const std::uint64_t> digests) {
  return find_mismatches(gather_words(comm, digests), comm.size(), 0, digests.size());
}

int healthy_rank(std::span<const DigestMismatch> mismatches, int world_size) {
  if (std::any_of(mismatches.begin(), mismatches.end(), [](const DigestMismatch& m) { return m.tie; })) return -1;
  for (int r = 0; r < world_size; ++r) {
    const bool everywhere = std::all_of(mismatches.begin(), mismatches.end(), [&](const DigestMismatch& m) {
      return std::binary_search(m.majority.begin(), m.majority.end(), r);
    });
    if (everywhere) return r;
  }
  return -1;
}

std::string describe_ranks(std::span<const int> ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

}  // namespace lockstep::ddp
