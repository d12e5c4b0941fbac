// Hierarchical all-reduce: exchanges inside each node, a ring across nodes.
//
// M nodes of G ranks each (Communicator::nodes() says which rank runs where;
// every node must hold the same number of ranks). Local rank l is a rank's
// place among its node's ranks, in rank order.
//
//   1. Reduce-scatter inside the node: every rank sends each other rank of
//      its node that rank's chunk of the buffer (G-1 messages, posted at
//      once), and sums what it receives for its own chunk, in local-rank
//      order. Local rank l then holds chunk (l+1) mod G, summed over its node.
//   2. All-reduce across nodes: the M ranks with local rank l (one per node)
//      run a whole ring all-reduce of that chunk, 2(M-1) rounds. Each of a
//      node's G ranks does so for its own chunk, so all G cross-node rings run
//      at once, side by side. For Mean, the chunk is scaled by 1/(M G) here.
//   3. All-gather inside the node: every rank sends its chunk to each other
//      rank of its node (G-1 messages).
//
// The buffer goes through the three steps in pieces of ~8 MiB (at most 16).
// Steps 1 and 3 are exchanges posted ahead, so that they run while the
// cross-node ring of the neighbouring pieces is on the wire and the links
// stay busy:
//   post RS(0); for k: wait RS(k), reduce; post RS(k+1); cross ring of k;
//   post AG(k). Wait every AG at the end.
//
// Rounds: 2 exchanges inside the node + 2(M-1), against 2(MG-1) for one
// ring over everyone.
// Bytes sent per rank: 2P(G-1)/G inside the node (as a ring there sends),
// 2(P/G)(M-1)/M across.
// Bytes through a node's link to the others: G x 2(P/G)(M-1)/M = 2P(M-1)/M,
// against 2P(N-1)/N for the flat ring (one message per round crosses each
// node boundary). With 4 nodes of 2 ranks: 1.5 P against 1.75 P, 14% less
// on the slowest links. Each chunk is summed by one rank in a fixed order
// (its own value, then the node's other ranks in local order, then the
// cross-node ring) and copied to the others, so every rank ends with the
// same bits. (With G > 2 that order differs from the node ring used before
// 2026-12-03, so those results differ in the last bits from earlier runs.)
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "algorithms.h"
#include "lockstep/error.h"

namespace lockstep::comm::detail {

std::optional<NodeLayout> node_layout(const Communicator& comm) {
  const std::vector<int> nodes = comm.nodes();
  const int n = comm.size();
  if (static_cast<int>(nodes.size()) != n || n < 2) return std::nullopt;
  NodeLayout layout;
  std::vector<int> node_ids;
  for (int r = 0; r < n; ++r) {
    std::size_t k = 0;
    while (k < node_ids.size() && node_ids[k] != nodes[static_cast<std::size_t>(r)]) ++k;
    if (k == node_ids.size()) {
      node_ids.push_back(nodes[static_cast<std::size_t>(r)]);
      layout.members.emplace_back();
    }
    layout.members[k].push_back(r);
  }
  const std::size_t g = layout.members.front().size();
  for (const auto& m : layout.members)
    if (m.size() != g) return std::nullopt;  // uneven nodes: no hierarchy to use
  layout.per_node = static_cast<int>(g);
  layout.nodes = static_cast<int>(layout.members.size());
  return layout;
}

std::vector<int> number_nodes(const std::vector<std::string>& hosts) {
  std::vector<std::string> distinct;
  std::vector<int> nodes(hosts.size());
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    const auto it = std::find(distinct.begin(), distinct.end(), hosts[r]);
    nodes[r] = static_cast<int>(it - distinct.begin());
    if (it == distinct.end()) distinct.push_back(hosts[r]);
  }
  return nodes;
}

NodeLayout require_node_layout(const Communicator& comm) {
  auto layout = node_layout(comm);
  if (!layout) {
    throw InvalidArgument(
        "the hierarchical all-reduce needs to know which ranks share a node, with the same number of "
        "ranks on every node; this backend or layout does not give that (use the ring: Algorithm::Ring, --algorithm ring)");
  }
  return *std::move(layout);
}

namespace {

// Pieces of the buffer that go through the three steps, so that the node
// exchanges of one piece overlap the cross-node ring of the next (below).
// About kPieceBytes each.
constexpr std::size_t kPieceBytes = std::size_t{8} << 20;
constexpr int kMaxPieces = 16;

int pieces_for(std::size_t bytes) {
  const std::size_t k = (bytes + kPieceBytes - 1) / kPieceBytes;
  return static_cast<int>(std::clamp<std::size_t>(k, 1, kMaxPieces));
}

}  // namespace

void hierarchical_allreduce(Communicator& comm, std::span<float> data, ReduceOp op, std::uint64_t seq,
                            std::size_t segment_bytes) {
  const NodeLayout layout = require_node_layout(comm);
  const int me = comm.rank();
  const int g = layout.per_node, m = layout.nodes;
  int node = 0, local = 0;
  for (int k = 0; k < m; ++k)
    for (int l = 0; l < g; ++l)
      if (layout.members[static_cast<std::size_t>(k)][static_cast<std::size_t>(l)] == me) node = k, local = l;
  const std::vector<int>& mine = layout.members[static_cast<std::size_t>(node)];
  std::vector<int> across(static_cast<std::size_t>(m));
  for (int k = 0; k < m; ++k)
    across[static_cast<std::size_t>(k)] = layout.members[static_cast<std::size_t>(k)][static_cast<std::size_t>(local)];
  const int n_total = g * m;
  const int pieces = pieces_for(data.size_bytes());
  auto piece = [&](int k) {
    const std::size_t b = chunk_begin(data.size(), pieces, k);
    return data.subspan(b, chunk_begin(data.size(), pieces, k + 1) - b);
  };
  // The chunk of a piece that local rank l sums: (l+1) mod G of the piece
  // cut in G.
  auto chunk_of = [&](std::span<float> p, int l) {
    const int c = (l + 1) % g;
    const std::size_t b = chunk_begin(p.size(), g, c);
    return p.subspan(b, chunk_begin(p.size(), g, c + 1) - b);
  };
  // Tags: piece k's node exchanges use rounds k (reduce-scatter) and
  // pieces + k (all-gather); its cross-node ring starts at round
  // 2 pieces + 2(M-1) k. The node's pairs and the cross-node pairs never
  // coincide. Two pieces' rings on one pair may share a tag when their
  // segment counts differ, which is harmless: one ring completes before the
  // next posts, and messages with one tag between one pair match in order.
  const int cross_base = 2 * pieces;
  auto cross_ring = [&](int k, std::span<float> slice) {
    if (m > 1) {
      ring_rounds(comm, {across, node, cross_base + 2 * (m - 1) * k}, slice, op, seq, segment_bytes, 0, 2 * (m - 1),
                  n_total);
    } else {
      finish(slice, op, n_total);
    }
  };
  if (g == 1) {
    for (int k = 0; k < pieces; ++k) cross_ring(k, piece(k));
    return;
  }

  // What the other G-1 ranks of the node send for our chunk: one slot per
  // peer (in local order, ours skipped), in two lanes for two pieces in flight.
  const std::size_t widest = (data.size() + static_cast<std::size_t>(pieces) - 1) / static_cast<std::size_t>(pieces);
  const std::size_t slot = widest / static_cast<std::size_t>(g) + 1;
  std::vector<float> landing(2 * static_cast<std::size_t>(g - 1) * slot);
  auto landing_of = [&](int k, int l, std::size_t size) {  // l: the sender's local rank
    const std::size_t s = static_cast<std::size_t>(l < local ? l : l - 1);
    return std::span<float>(landing).subspan(((k % 2) * static_cast<std::size_t>(g - 1) + s) * slot, size);
  };
  using Exchange = std::vector<std::unique_ptr<Work>>;
  auto post_rs = [&](int k) {
    auto p = piece(k);
    const auto tag = make_tag(seq, static_cast<std::uint32_t>(k));
    Exchange e;
    for (int l = 0; l < g; ++l) {
      if (l == local) continue;
      const int peer = mine[static_cast<std::size_t>(l)];
      e.push_back(comm.post_recv(peer, tag, std::as_writable_bytes(landing_of(k, l, chunk_of(p, local).size()))));
      e.push_back(comm.post_send(peer, tag, std::as_bytes(chunk_of(p, l))));
    }
    return e;
  };
  auto wait_all = [&](Exchange& e) {
    for (auto& w : e) w->wait(comm.timeout());
  };
  std::vector<Exchange> gathers;
  gathers.reserve(static_cast<std::size_t>(pieces));
  Exchange rs = post_rs(0);
  for (int k = 0; k < pieces; ++k) {
    auto p = piece(k);
    auto own = chunk_of(p, local);
    wait_all(rs);
    for (int l = 0; l < g; ++l)
      if (l != local) reduce_into(own, landing_of(k, l, own.size()), op);
    if (k + 1 < pieces) rs = post_rs(k + 1);
    cross_ring(k, own);
    const auto tag = make_tag(seq, static_cast<std::uint32_t>(pieces + k));
    Exchange ag;
    for (int l = 0; l < g; ++l) {
      if (l == local) continue;
      const int peer = mine[static_cast<std::size_t>(l)];
      ag.push_back(comm.post_recv(peer, tag, std::as_writable_bytes(chunk_of(p, l))));
      ag.push_back(comm.post_send(peer, tag, std::as_bytes(own)));
    }
    gathers.push_back(std::move(ag));
  }
  for (auto& e : gathers) wait_all(e);
}

}  // namespace lockstep::comm::detail
