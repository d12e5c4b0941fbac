// Private: the all-reduce algorithms behind comm::allreduce, one per file,
// and the element-wise kernels they share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/comm/collectives.h"
#include "tags.h"

namespace lockstep::comm::detail {

// Auto uses halving-doubling below this size (when there is no native path).
inline constexpr std::size_t kHalvingDoublingMaxBytes = std::size_t{64} << 10;

// The ring cuts each chunk into segments of at most this many bytes by
// default (AllreduceOptions::ring_segment_bytes), so that one segment is on
// the wire while the previous one is reduced. Measured at 64 MiB across four
// hosts on 1 Gbit/s links: 0.932 of the link unsegmented, 0.940 / 0.942 /
// 0.957 with 1 / 2 / 4 MiB segments (docs/results.md).
inline constexpr std::size_t kRingSegmentBytes = std::size_t{4} << 20;

// Segments per chunk of `chunk_bytes` with segments of `segment_bytes` (0:
// kRingSegmentBytes), so that `rounds` rounds of them still number within a
// tag's 16 bits.
inline int ring_segments(std::size_t chunk_bytes, int rounds, std::size_t segment_bytes = 0) {
  if (segment_bytes == 0) segment_bytes = kRingSegmentBytes;
  const std::size_t wanted = (chunk_bytes + segment_bytes - 1) / segment_bytes;
  // At least 1 segment, so the ring always reduces (only N > 32768 makes
  // 2(N-1) rounds overflow 16 bits, and then tags collide whatever m is).
  const std::size_t most = std::max<std::size_t>(1, 0xffffu / static_cast<std::size_t>(rounds > 0 ? rounds : 1));
  return static_cast<int>(wanted < 1 ? 1 : wanted > most ? most : wanted);
}

// Blocking send and receive of a collective's own tags (make_tag), with the
// communicator's timeout; comm::send and comm::recv take a program's tags only.
inline void send_tagged(Communicator& comm, int peer, std::uint64_t tag, std::span<const std::byte> data) {
  comm.post_send(peer, tag, data)->wait(comm.timeout());
}
inline void recv_tagged(Communicator& comm, int peer, std::uint64_t tag, std::span<std::byte> data) {
  comm.post_recv(peer, tag, data)->wait(comm.timeout());
}

// acc[i] = op(acc[i], in[i]) for Sum/Mean (sum), Max, Min.
void reduce_into(std::span<float> acc, std::span<const float> in, ReduceOp op);
// Final step of Mean: data[i] *= 1/world_size. No-op for other ops.
void finish(std::span<float> data, ReduceOp op, int world_size);

// [begin, end) of chunk `i` when `count` elements are cut into `n` chunks.
inline std::size_t chunk_begin(std::size_t count, int n, int i) {
  return count * static_cast<std::size_t>(i) / static_cast<std::size_t>(n);
}

// A ring over some of the communicator's ranks: `ranks` in ring order,
// `ranks[me]` is this rank. Its tags start at round `first_tag`, so that
// several rings of one collective never share a tag.
struct RingGroup {
  std::span<const int> ranks;
  int me = 0;
  int first_tag = 0;
};

// Rounds [first, last) of the ring all-reduce over `group` (0 .. n-2: the
// reduce-scatter, after which ranks[me] holds chunk (me+1) mod n reduced;
// n-1 .. 2n-3: the all-gather of those chunks). With op Mean and
// mean_over > 0 the completed chunk is scaled by 1/mean_over.
void ring_rounds(Communicator& comm, const RingGroup& group, std::span<float> data, ReduceOp op,
                 std::uint64_t sequence, std::size_t segment_bytes, int first, int last, int mean_over);
// The same over every rank of `comm`, in rank order (the flat ring).
void ring_rounds(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t sequence,
                 std::size_t segment_bytes, int first, int last, int mean_over);

// The algorithms proper; the front door has numbered the call (`sequence`)
// and checked its fingerprint.
void ring_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t sequence,
                    std::size_t segment_bytes = 0);
void naive_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t sequence);
void halving_doubling_allreduce(Communicator& comm, std::span<float> data, ReduceOp op,
                                std::uint64_t sequence);
void tree_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t sequence);

// Which ranks share a node: `members[k]` are node k's ranks in rank order,
// nodes numbered by their lowest rank. nullopt when the backend does not say
// (Communicator::nodes() is empty) or the nodes hold different numbers of ranks.
struct NodeLayout {
  int nodes = 0, per_node = 0;
  std::vector<std::vector<int>> members;
};
std::optional<NodeLayout> node_layout(const Communicator& comm);
// What a backend's nodes() returns: each rank's host name numbered in order
// of first appearance, so every rank that sees the same names gets the same vector.
std::vector<int> number_nodes(const std::vector<std::string>& hosts);
// node_layout(), or InvalidArgument naming what the hierarchical all-reduce needs.
NodeLayout require_node_layout(const Communicator& comm);
// Throws InvalidArgument when node_layout() is nullopt.
void hierarchical_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t sequence,
                            std::size_t segment_bytes = 0);

// The front door with the kind of collective it serves (barrier is an
// all-reduce of one float under its own name).
void allreduce_as(Communicator& comm, std::span<float> data, const AllreduceOptions& options,
                  CollectiveKind kind);

}  // namespace lockstep::comm::detail
