// The start-up handshake (include/lockstep/ddp/handshake.h).
//   1. digest of the field names, in order: one all-reduce of N x 4 floats;
//   2. digest of each field's value: one all-reduce of N x fields x 4 floats.
// Every rank sees the same gathered digests, so every rank throws the same
// message, or none does.
#include "lockstep/ddp/handshake.h"

#include <vector>

#include "lockstep/ddp/replica_digest.h"
#include "lockstep/error.h"

namespace lockstep::ddp {
namespace {

std::uint64_t digest_of(const std::string& s) {
  return digest(std::as_bytes(std::span(s.data(), s.size())));
}

}  // namespace

void handshake(comm::Communicator& comm, std::span<const HandshakeField> fields) {
  std::string names;
  for (const auto& f : fields) names += f.name + '\n';
  const std::uint64_t name_digest = digest_of(names);
  if (auto m = compare_across_ranks(comm, std::span(&name_digest, 1)); !m.empty()) {
    throw InvalidArgument("start-up handshake: " + describe_ranks(m[0].ranks) +
                          " describes its run with other fields than " + describe_ranks(m[0].majority) +
                          "; start every replica from the same build of lockstep.");
  }
  std::vector<std::uint64_t> digests;
  for (const auto& f : fields) digests.push_back(digest_of(f.value));
  const auto mismatches = compare_across_ranks(comm, digests);
  if (mismatches.empty()) return;
  std::string what;
  for (const auto& m : mismatches) {
    if (!what.empty()) what += "; ";
    what += fields[m.field].name + " differs on " + describe_ranks(m.ranks) + " from " +
            describe_ranks(m.majority);
  }
  throw InvalidArgument("start-up handshake refused: " + what +
                        ". Start every replica with the same flags, data and build.");
}

}  // namespace lockstep::ddp
