// The price of one all-reduce: alpha-beta-gamma terms per algorithm.
//
// alpha = the latency of one message, beta = seconds per byte on a link,
// gamma = seconds per byte of reduction arithmetic. P = bytes all-reduced,
// N = replicas, G = replicas per node, M = nodes = ceil(N / G). Every node has
// one inter-node link (its NIC), shared by its G replicas. The formulas, with
// their derivation, are in docs/cost-model.md; collective_cost.cpp repeats
// them beside the code.
//
// Pure functions, no state; thread-safe. Throws InvalidArgument for a
// topology or size that cannot exist.
#pragma once

#include <string_view>
#include <vector>

namespace lockstep::cost {

// The most replicas the model prices (2^20): its per-round sums are O(N log N).
inline constexpr int kMaxModelledReplicas = 1 << 20;

struct Link {
  double bytes_per_second = 1.25e9;  // 10 Gbit/s
  double latency_s = 50e-6;          // per message
};

// Two levels: replicas inside a node share `intra`; nodes talk over `inter`.
// per_node = 1 (the default) is a flat network: every replica is its own node.
struct Topology {
  int per_node = 1;
  Link intra{.bytes_per_second = 100e9, .latency_s = 5e-6};  // NVLink-class; unused when per_node = 1
  Link inter;
};

enum class Algorithm {
  Ring,             // reduce-scatter + all-gather around one ring of N
  HalvingDoubling,  // Rabenseifner: recursive halving, then doubling (a fold when N is not 2^k)
  Tree,             // pipelined double binary tree (NCCL): log-depth latency, 2P on the bottleneck link
  Hierarchical,     // ring reduce-scatter in nodes, ring all-reduce across nodes, ring all-gather in nodes
  Auto,             // what `lockstep train --algorithm auto` does point to point: HD below 64 KiB, else the
                    // hierarchical all-reduce across several nodes of equal size, else the ring
  Best,             // the cheapest of the first four for this size
};
const char* to_string(Algorithm algorithm);
Algorithm algorithm_from_string(std::string_view name);  // throws InvalidArgument naming the choices

struct CollectiveCost {
  Algorithm algorithm = Algorithm::Ring;  // resolved: never Auto or Best
  double seconds = 0;                     // alpha_s + beta_s + gamma_s
  double alpha_s = 0, beta_s = 0, gamma_s = 0;
  double bytes_sent = 0;  // per replica (the busiest one)
  int rounds = 0;         // messages in sequence on the critical path
};

// Where halving-doubling's rounds cross nodes, for `replicas` at `per_node`
// (the rounds in order: fold, halving, doubling, unfold; the fold's only when
// N is not a power of two): the most messages leaving one node, and whether
// any message stays inside a node. It depends on N and G only, and takes
// O(N log N) to work out, so a caller pricing many all-reduces of one group
// (predict_step, per bucket) works it out once and passes it in.
struct HalvingDoublingPlacement {
  int replicas = 0, per_node = 0;
  std::vector<int> most_leaving;
  std::vector<char> within;
};
// InvalidArgument unless 1 <= replicas <= kMaxModelledReplicas and per_node >= 1.
HalvingDoublingPlacement halving_doubling_placement(int replicas, int per_node);

// One all-reduce of `bytes` over `replicas`. `reduce_bytes_per_s` is the rate
// at which a replica adds received bytes into its own (0: free, no gamma).
// replicas = 1 costs nothing. `placement`, if given, must be
// halving_doubling_placement(replicas, min(topology.per_node, replicas)).
CollectiveCost allreduce_cost(double bytes, int replicas, const Topology& topology, Algorithm algorithm,
                              double reduce_bytes_per_s = 0, const HalvingDoublingPlacement* placement = nullptr);

}  // namespace lockstep::cost
