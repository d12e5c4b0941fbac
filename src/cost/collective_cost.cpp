// Alpha-beta-gamma cost of one all-reduce, per algorithm.
//
// P bytes, N replicas, G per node, M = ceil(N / G) nodes. A message of B
// bytes on a link costs alpha + B beta. Replicas are numbered node by node,
// and each node has one inter-node link shared by its replicas: when all G
// replicas of a node send B across nodes in the same round, the NIC carries
// G B. A round costs its slowest message. gamma is charged per byte a
// replica adds into its buffer.
//
// Ring (flat, 2(N-1) rounds of P/N): every round crosses each node boundary
// once, so with M > 1 the bottleneck is max(intra, inter) per round:
//   2(N-1) alpha + 2P(N-1)/N beta + P(N-1)/N gamma
// Halving-doubling (p = 2^floor(log2 N), e = N - p): fold e odd ranks into
// their even neighbours (P), 2 log2 p rounds of P/2, P/4, ... then back,
// unfold (P). Each round's pairs are placed as the algorithm places them
// (after the fold, virtual rank v is real rank 2v for v < e, else v + e); a
// round costs its slowest message, a node's link carrying every message that
// leaves the node in it. Without a fold (e = 0):
//   2 log2 p alpha + 2P(p-1)/p beta, and with one, + 2 alpha + 2P beta;
// for N and G powers of two, a round at distance d >= G crosses nodes with
// all G replicas on the node's link, and the others stay inside. Where the
// rounds cross depends on N and G only: halving_doubling_placement.
// Tree (NCCL's pipelined double binary tree, chains inside nodes): every
// replica receives and sends P in the reduce and P in the broadcast (half
// the data on each tree), the pipeline is as deep as the tree:
//   2 (ceil(log2 M) alpha_inter + (G-1) alpha_intra) + 2P max(beta) + P gamma
// Hierarchical: ring reduce-scatter inside nodes (P/G each), ring all-reduce
// across nodes of each replica's P/G (the G replicas of a node lead one
// slice each, sharing the NIC), ring all-gather inside nodes:
//   2(G-1)(alpha_i + P/G beta_i) + 2(M-1)(alpha_e + P/M beta_e)
#include "lockstep/cost/collective_cost.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/error.h"

namespace lockstep::cost {
namespace {

constexpr double kAutoSwitchBytes = 64 * 1024;  // comm::Algorithm::Auto's point-to-point threshold

double beta(const Link& link) {
  return 1.0 / link.bytes_per_second;
}

struct Shape {
  int n, g, m;  // replicas, per node, nodes
};

// A message's link: alpha and beta.
struct Hop {
  double alpha, beta;
};

CollectiveCost ring(double p, const Shape& s, const Topology& t, double gamma) {
  CollectiveCost c{.algorithm = Algorithm::Ring};
  const double chunk = p / s.n;
  // Round time: the slowest of an intra message and (with M > 1) the one
  // inter-node message each node sends; only one replica per node crosses.
  Hop h = s.m > 1 ? Hop{t.inter.latency_s, beta(t.inter)} : Hop{t.intra.latency_s, beta(t.intra)};
  if (s.m > 1 && s.g > 1 && t.intra.latency_s + chunk * beta(t.intra) > h.alpha + chunk * h.beta)
    h = {t.intra.latency_s, beta(t.intra)};
  c.rounds = 2 * (s.n - 1);
  c.alpha_s = c.rounds * h.alpha;
  c.beta_s = c.rounds * chunk * h.beta;
  c.gamma_s = (s.n - 1) * chunk * gamma;
  c.bytes_sent = c.rounds * chunk;
  return c;
}

CollectiveCost halving_doubling(double p, const Shape& s, const Topology& t, double gamma,
                                const HalvingDoublingPlacement& where) {
  CollectiveCost c{.algorithm = Algorithm::HalvingDoubling};
  int pow2 = 1;
  while (pow2 * 2 <= s.n) pow2 *= 2;
  const bool fold = s.n > pow2;
  // A round costs its slowest message; a node's link carries every message
  // that leaves the node in it.
  std::size_t round = 0;
  auto add_round = [&](double bytes, double reduced) {
    const int most = where.most_leaving[round];
    const bool within = where.within[round] != 0;
    ++round;
    double alpha = 0, time = 0;
    if (most > 0) alpha = t.inter.latency_s, time = bytes * beta(t.inter) * most;
    if (within) alpha = std::max(alpha, t.intra.latency_s), time = std::max(time, bytes * beta(t.intra));
    c.alpha_s += alpha;
    c.beta_s += time;
    c.gamma_s += reduced * gamma;
    c.bytes_sent += bytes;
    c.rounds += 1;
  };
  if (fold) add_round(p, p);  // fold: odd r -> r-1
  double seg = p;
  for (int d = pow2 / 2; d >= 1; d /= 2) {  // reduce-scatter by halving
    seg /= 2;
    add_round(seg, seg);
  }
  for (int d = 1; d < pow2; d *= 2) {  // all-gather by doubling
    add_round(seg, 0);
    seg *= 2;
  }
  if (fold) add_round(p, 0);  // unfold: the same pairs, back
  return c;
}

CollectiveCost tree(double p, const Shape& s, const Topology& t, double gamma) {
  CollectiveCost c{.algorithm = Algorithm::Tree};
  const int depth = s.m > 1 ? static_cast<int>(std::ceil(std::log2(s.m))) : 0;
  c.rounds = 2 * (depth + (s.g - 1));
  c.alpha_s = 2 * (depth * t.inter.latency_s + (s.g - 1) * t.intra.latency_s);
  double b = 0;
  if (s.m > 1) b = std::max(b, beta(t.inter));
  if (s.g > 1) b = std::max(b, beta(t.intra));
  c.beta_s = 2 * p * b;
  c.gamma_s = p * gamma;
  c.bytes_sent = 2 * p;
  return c;
}

CollectiveCost hierarchical(double p, const Shape& s, const Topology& t, double gamma) {
  if (s.m == 1 || s.g == 1) {
    CollectiveCost c = ring(p, s, t, gamma);
    c.algorithm = Algorithm::Hierarchical;
    return c;
  }
  CollectiveCost c{.algorithm = Algorithm::Hierarchical};
  const double in_node = p / s.g;
  c.rounds = 2 * (s.g - 1) + 2 * (s.m - 1);
  c.alpha_s = 2 * (s.g - 1) * t.intra.latency_s + 2 * (s.m - 1) * t.inter.latency_s;
  c.beta_s = 2 * (s.g - 1) * in_node * beta(t.intra) + 2 * (s.m - 1) * (p / s.m) * beta(t.inter);
  c.gamma_s = ((s.g - 1) * in_node + (s.m - 1) * in_node / s.m) * gamma;
  c.bytes_sent = 2 * (s.g - 1) * in_node + 2 * (s.m - 1) * in_node / s.m;
  return c;
}

void check_link(const Link& link, const char* which) {
  if (!(link.bytes_per_second > 0) || !std::isfinite(link.bytes_per_second))
    throw InvalidArgument(std::string("the ") + which +
                          " link's bandwidth must be positive and finite; give it with a unit, e.g. 10Gbit.");
  if (!(link.latency_s >= 0) || !std::isfinite(link.latency_s))
    throw InvalidArgument(std::string("the ") + which +
                          " link's latency must be zero or positive, e.g. 50us.");
}

}  // namespace

const char* to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::Ring:
      return "ring";
    case Algorithm::HalvingDoubling:
      return "halving_doubling";
    case Algorithm::Tree:
      return "tree";
    case Algorithm::Hierarchical:
      return "hierarchical";
    case Algorithm::Auto:
      return "auto";
    case Algorithm::Best:
      return "best";
  }
  return "?";
}

Algorithm algorithm_from_string(std::string_view name) {
  for (Algorithm a : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree, Algorithm::Hierarchical,
                      Algorithm::Auto, Algorithm::Best})
    if (name == to_string(a)) return a;
  throw InvalidArgument("unknown all-reduce algorithm '" + std::string(name) +
                        "'; choose best, auto, ring, halving_doubling, tree or hierarchical.");
}

HalvingDoublingPlacement halving_doubling_placement(int replicas, int per_node) {
  if (replicas < 1 || replicas > kMaxModelledReplicas || per_node < 1) {
    throw InvalidArgument("halving_doubling_placement: " + std::to_string(replicas) + " replicas, " +
                          std::to_string(per_node) + " per node; both must be at least 1, replicas at most " +
                          std::to_string(kMaxModelledReplicas) + ".");
  }
  HalvingDoublingPlacement out{.replicas = replicas, .per_node = per_node};
  if (replicas < 2) return out;
  int pow2 = 1;
  while (pow2 * 2 <= replicas) pow2 *= 2;
  const int extra = replicas - pow2;
  const int nodes = (replicas + per_node - 1) / per_node;
  // As halving_doubling_allreduce.cpp numbers them: after the fold, virtual
  // rank v runs on real rank 2v (v < e) or v + e.
  const auto real_rank = [&](int v) { return v < extra ? 2 * v : v + extra; };
  std::vector<int> leaving(static_cast<std::size_t>(nodes));
  const auto round = [&](auto&& each_message) {
    std::fill(leaving.begin(), leaving.end(), 0);
    bool within = false;
    each_message([&](int from, int to) {
      if (from / per_node != to / per_node) {
        ++leaving[static_cast<std::size_t>(from / per_node)];
      } else {
        within = true;
      }
    });
    out.most_leaving.push_back(*std::max_element(leaving.begin(), leaving.end()));
    out.within.push_back(within ? 1 : 0);
  };
  const auto fold = [&](auto&& send) {
    for (int i = 0; i < extra; ++i) send(2 * i + 1, 2 * i);
  };
  const auto exchange = [&](int d) {
    return [&, d](auto&& send) {
      for (int v = 0; v < pow2; ++v) send(real_rank(v), real_rank(v ^ d));
    };
  };
  if (extra > 0) round(fold);
  for (int d = pow2 / 2; d >= 1; d /= 2) round(exchange(d));
  for (int d = 1; d < pow2; d *= 2) round(exchange(d));
  if (extra > 0) round(fold);
  return out;
}

CollectiveCost allreduce_cost(double bytes, int replicas, const Topology& topology, Algorithm algorithm,
                              double reduce_bytes_per_s, const HalvingDoublingPlacement* placement) {
  if (replicas < 1 || replicas > kMaxModelledReplicas)
    throw InvalidArgument("replicas must be from 1 to " + std::to_string(kMaxModelledReplicas) + ", got " +
                          std::to_string(replicas) + ".");
  if (!(bytes >= 0) || !std::isfinite(bytes))
    throw InvalidArgument("the all-reduce size must be zero or more bytes, got " + std::to_string(bytes) +
                          ".");
  if (topology.per_node < 1)
    throw InvalidArgument("replicas per node must be at least 1, got " + std::to_string(topology.per_node) +
                          ".");
  if (reduce_bytes_per_s < 0) throw InvalidArgument("the reduction rate must be zero (free) or positive.");
  check_link(topology.inter, "inter-node");
  if (topology.per_node > 1) check_link(topology.intra, "intra-node");

  const int per_node = std::min(topology.per_node, replicas);
  const Shape shape{replicas, per_node, (replicas + per_node - 1) / per_node};
  const double gamma = reduce_bytes_per_s > 0 ? 1.0 / reduce_bytes_per_s : 0;
  if (replicas == 1 || bytes == 0) {
    const Algorithm a =
        algorithm == Algorithm::Auto || algorithm == Algorithm::Best ? Algorithm::Ring : algorithm;
    return {.algorithm = a};
  }
  auto total = [](CollectiveCost c) {
    c.seconds = c.alpha_s + c.beta_s + c.gamma_s;
    return c;
  };
  // Worked out here unless the caller has it (it depends on N and G only).
  HalvingDoublingPlacement own;
  const auto placed = [&]() -> const HalvingDoublingPlacement& {
    if (placement != nullptr && placement->replicas == replicas && placement->per_node == per_node) return *placement;
    if (own.replicas == 0) own = halving_doubling_placement(replicas, per_node);
    return own;
  };
  switch (algorithm) {
    case Algorithm::Ring:
      return total(ring(bytes, shape, topology, gamma));
    case Algorithm::HalvingDoubling:
      return total(halving_doubling(bytes, shape, topology, gamma, placed()));
    case Algorithm::Tree:
      return total(tree(bytes, shape, topology, gamma));
    case Algorithm::Hierarchical:
      return total(hierarchical(bytes, shape, topology, gamma));
    case Algorithm::Auto: {
      // comm::Algorithm::Auto: across several nodes of equal size, the hierarchical all-reduce.
      const bool even_nodes = shape.m > 1 && shape.g > 1 && replicas % per_node == 0;
      return total(bytes < kAutoSwitchBytes ? halving_doubling(bytes, shape, topology, gamma, placed())
                   : even_nodes             ? hierarchical(bytes, shape, topology, gamma)
                                            : ring(bytes, shape, topology, gamma));
    }
    case Algorithm::Best:
      break;
  }
  CollectiveCost best = total(ring(bytes, shape, topology, gamma));
  for (CollectiveCost c :
       {halving_doubling(bytes, shape, topology, gamma, placed()), tree(bytes, shape, topology, gamma),
        hierarchical(bytes, shape, topology, gamma)}) {
    c = total(c);
    if (c.seconds < best.seconds * (1 - 1e-12)) best = c;
  }
  return best;
}

}  // namespace lockstep::cost
