// One step's timeline under bucketed overlap (lockstep/cost/step_cost.h).
//
// Backward runs the layers last to first. With accumulation, the all-reduce
// happens in the last micro-step only, so every earlier micro-step is pure
// compute. The buckets are ddp::assign_buckets' own, over one tensor per
// layer, so the plan and the trainer agree on what is launched when. Two
// other launch schedules model other systems: one all-reduce per layer, and
// Horovod's cycles (fuse what is ready every cycle_ms, after the ranks agree
// on it).
#include "lockstep/cost/step_cost.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "lockstep/ddp/reducer.h"
#include "lockstep/error.h"

namespace lockstep::cost {

double core_sharing(int replicas, int host_cores) {
  if (host_cores <= 0 || replicas <= host_cores) return 1;
  return double(replicas) / double(host_cores);
}

// E[max] = integral of x n phi(x) Phi(x)^(n-1) dx, by Simpson's rule on
// [-10, 10] in steps of 1/512: the integrand beyond is below 1e-20 for any
// n this model meets (up to 2^31), and the error of the rule below 1e-9.
double expected_max_normal(int n) {
  if (n < 1) throw InvalidArgument("the number of replicas must be at least 1, got " + std::to_string(n) + ".");
  if (n == 1) return 0;
  constexpr double kLo = -10, kHi = 10;
  constexpr int kSteps = 20 * 512;  // even
  const double h = (kHi - kLo) / kSteps;
  const auto f = [n](double x) {
    const double phi = std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi);
    const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
    // log Phi(x): through log1p of the upper tail where Phi is near 1, so
    // (n - 1) log Phi keeps its digits for n up to 2^31.
    const double log_cdf = x > 0 ? std::log1p(-0.5 * std::erfc(x / std::sqrt(2.0))) : std::log(cdf);
    return cdf <= 0 ? 0.0 : x * n * phi * std::exp((n - 1) * log_cdf);
  };
  double sum = f(kLo) + f(kHi);
  for (int i = 1; i < kSteps; ++i) sum += (i % 2 ? 4 : 2) * f(kLo + i * h);
  return sum * h / 3;
}

namespace {

// Horovod's cycles in steady state (docs/cost-model.md, "Launch schedules").
// The background thread keeps its own clock: it wakes every cycle_ms, and a
// cycle that finds gradients ready on every rank pays the agreement, then
// all-reduces them, fused in order into buffers of at most bucket_mb (0: no
// fusion; a bigger layer goes alone). The next cycle begins cycle_ms after
// this one began, or when its all-reduces end if that is later. Steps follow
// each other on the same clock (a step begins when the last one's optimizer
// ends), so where a step falls against the cycles depends on the steps
// before it. The model runs kWarmup steps, then averages kMeasured:
// returns the mean exposed time; the terms are per-step means through
// `all_reduce`, and s.buckets lists the last step's all-reduces.
template <typename AllReduce>
double cycle_steady_state(const StepOptions& o, const std::vector<double>& ready,
                          const std::vector<std::size_t>& numels, double backward_end, double compute_ms,
                          AllReduce&& all_reduce, double* negotiation_ms) {
  constexpr int kWarmup = 16, kMeasured = 64;
  const double f = core_sharing(o.replicas, o.host_cores);
  // Agreeing on what is ready: a binomial-tree gather to rank 0 and a
  // broadcast back, log2(G) rounds inside a node and log2(M) across nodes.
  const int g = std::max(1, std::min(o.topology.per_node, o.replicas));
  const int m = (o.replicas + g - 1) / g;
  const auto lg = [](int x) { return std::ceil(std::log2(double(std::max(1, x)))); };
  const double negotiation = 1e3 * 2 *
                             (lg(g) * (o.topology.intra.latency_s + f * o.host_latency_s) +
                              lg(m) * (o.topology.inter.latency_s + f * o.host_latency_s));
  const double cap = double(std::llround(o.bucket_mb * (1 << 20)));
  const double wire = o.bf16 ? 0.5 : 1.0;
  // The layers with gradients, in the order backward readies them.
  std::vector<std::size_t> order;
  for (std::size_t i = ready.size(); i-- > 0;)
    if (numels[i] > 0) order.push_back(i);

  double step_start = 0, cycle = 0, exposed_sum = 0;
  *negotiation_ms = 0;
  for (int step = 0; step < kWarmup + kMeasured; ++step) {
    const bool measured = step >= kWarmup, last = step + 1 == kWarmup + kMeasured;
    const double weight = measured ? 1.0 / kMeasured : 0.0;
    const auto at = [&](std::size_t k) { return step_start + ready[order[k]]; };
    std::size_t next = 0;  // order[next] is the next layer to send
    double end = step_start;
    while (next < order.size()) {
      if (at(next) > cycle) {  // nothing ready: sleep to the first cycle after it is
        cycle += o.cycle_ms * std::ceil((at(next) - cycle) / o.cycle_ms);
        continue;
      }
      double t = cycle + negotiation;
      *negotiation_ms += weight * negotiation;
      while (next < order.size() && at(next) <= cycle) {
        double bytes = 0, last_ready = 0;
        while (next < order.size() && at(next) <= cycle) {
          const double b = double(numels[order[next]]) * 4;
          if (bytes > 0 && (cap == 0 || (bytes + b) * wire > cap)) break;
          bytes += b;
          last_ready = std::max(last_ready, at(next));
          ++next;
        }
        t = all_reduce(bytes, last_ready - step_start, t - step_start, weight, last) + step_start;
      }
      end = t;
      cycle = std::max(t, cycle + o.cycle_ms);
    }
    const double exposed = std::max(0.0, end - (step_start + backward_end));
    if (measured) exposed_sum += exposed;
    step_start += compute_ms + exposed;
  }
  return exposed_sum / kMeasured;
}

}  // namespace

StepPrediction predict_step(const Profile& profile, const StepOptions& o) {
  if (o.replicas < 1)
    throw InvalidArgument("replicas must be at least 1, got " + std::to_string(o.replicas) + ".");
  if (o.micro_batch < 1)
    throw InvalidArgument("the micro-batch must be at least 1, got " + std::to_string(o.micro_batch) + ".");
  if (o.accumulate < 1)
    throw InvalidArgument("accumulate must be at least 1, got " + std::to_string(o.accumulate) + ".");
  if (!(o.host_latency_s >= 0))
    throw InvalidArgument("the host latency must be zero or positive seconds.");
  if (o.host_cores < 0)
    throw InvalidArgument("host cores must be zero (a device per replica) or positive, got " +
                          std::to_string(o.host_cores) + ".");
  if (!(o.bucket_mb >= 0) || !(o.first_bucket_mb >= 0))
    throw InvalidArgument("bucket sizes must be zero or positive MiB.");
  if (!(o.compute_cv >= 0 && std::isfinite(o.compute_cv)))
    throw InvalidArgument("the compute's coefficient of variation must be zero or positive, e.g. 0.03.");
  for (const LayerCost& l : profile.layers) {
    const auto good = [](double v) { return std::isfinite(v) && v >= 0; };
    if (!good(l.param_bytes) || !good(l.forward_ms) || !good(l.backward_ms))
      throw InvalidArgument("layer '" + l.name + "' of the profile has a negative or non-finite parameter size " +
                            "or time; every one must be a number of zero or more.");
  }
  if (!(std::isfinite(profile.step_compute_ms) && profile.step_compute_ms >= 0) ||
      !(std::isfinite(profile.activation_bytes_per_sample) && profile.activation_bytes_per_sample >= 0))
    throw InvalidArgument("the profile's step compute time and activation bytes must be numbers of zero or more.");
  if (o.zero1 && (o.launch != StepOptions::Launch::Buckets || o.bf16))
    throw InvalidArgument("ZeRO-1 is planned as lockstep train runs it: gradient buckets in float32, so neither "
                          "another --launch nor bf16.");
  if (profile.layers.empty() || profile.param_bytes() <= 0 || profile.micro_batch < 1)
    throw InvalidArgument("the model has no parameters, so there is nothing to all-reduce.");

  const double f = core_sharing(o.replicas, o.host_cores);
  // The slowest of N: its forward and backward, and so every ready time, stretch by `slowest`.
  // c is the variation of one micro-step at the profile's micro-batch; jitter independent over
  // time averages out as sqrt(work), so K micro-steps of r times the batch vary by c / sqrt(K r).
  const double work = double(o.accumulate) * double(o.micro_batch) / double(profile.micro_batch);
  const double slowest = o.compute_cv > 0 ? 1 + o.compute_cv / std::sqrt(work) * expected_max_normal(o.replicas) : 1;
  const double scale = slowest * double(o.micro_batch) / double(profile.micro_batch);
  const std::size_t n = profile.layers.size();
  StepPrediction s;
  s.gradient_bytes = profile.param_bytes();
  double fwd = 0, bwd = 0;
  for (const auto& l : profile.layers) {
    fwd += l.forward_ms * scale;
    bwd += l.backward_ms * scale;
  }
  // Shared cores: the other replicas' turns come first (f x the compute in all).
  const double turns = (f - 1) * (fwd + bwd) * o.accumulate;
  s.forward_ms = f * fwd * o.accumulate;
  s.backward_ms = f * bwd * o.accumulate;
  s.sharing = f;
  const bool sharded = o.zero1 && o.replicas > 1;
  // ZeRO-1: its own 1/N, and the zeroing of the other gradients (one pass).
  const double n_replicas = double(o.replicas);
  const double optimizer_share =
      !sharded ? 1
               : 1 / n_replicas + (o.optimizer_passes > 0 ? (n_replicas - 1) / n_replicas / o.optimizer_passes : 0);
  s.optimizer_ms = f * profile.optimizer_ms() * optimizer_share;
  s.compute_ms = s.forward_ms + s.backward_ms + s.optimizer_ms;
  s.straggler_ms = (s.forward_ms + s.backward_ms) * (1 - 1 / slowest);

  // Gradient of layer i ready at: earlier micro-steps, the last forward, and
  // backward from the last layer down to i.
  const double last_backward_start = turns + (o.accumulate - 1) * (fwd + bwd) + fwd;
  std::vector<double> ready(n);
  double t = last_backward_start;
  for (std::size_t i = n; i-- > 0;) {
    t += profile.layers[i].backward_ms * scale;
    ready[i] = t;
  }
  const double backward_end = t;

  // The price of one all-reduce of `bytes` with the host's terms on top of
  // the link's: f x h per round, and the N replicas' reductions on C cores
  // (at least f x gamma). With Best, the cheapest once these are added.
  // Where halving-doubling crosses nodes: once per step, not per bucket and algorithm (O(N log N)).
  const HalvingDoublingPlacement placement =
      halving_doubling_placement(o.replicas, std::min(o.topology.per_node, o.replicas));
  const auto on_this_host = [&](double bytes, Algorithm a) {
    CollectiveCost c = allreduce_cost(bytes, o.replicas, o.topology, a, o.reduce_bytes_per_s, &placement);
    c.alpha_s += c.rounds * f * o.host_latency_s;
    c.seconds = c.alpha_s + c.beta_s + c.gamma_s;
    if (f > 1 && f * c.gamma_s > c.seconds) {
      const double extra = f * c.gamma_s - c.seconds;
      c.gamma_s += extra;
      c.seconds += extra;
    }
    return c;
  };
  const double wire = o.bf16 ? 0.5 : 1.0;  // bytes on the wire per fp32 gradient byte
  const auto price = [&](double bytes) {
    CollectiveCost c = on_this_host(bytes, o.algorithm);
    if (o.algorithm == Algorithm::Best)
      for (Algorithm a : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree, Algorithm::Hierarchical}) {
        const CollectiveCost other = on_this_host(bytes, a);
        if (other.seconds < c.seconds * (1 - 1e-12)) c = other;
      }
    return c;
  };
  // One all-reduce launched at `start`, of layers whose last gradient was ready at `ready_ms`.
  // One all-reduce of `fp32_bytes`, launched at `start_ms`, of layers whose
  // last gradient was ready at `ready_ms`. Its terms count `weight` times
  // (Cycles averages over steps); `record` lists it in s.buckets.
  double largest = -1;
  const auto all_reduce = [&](double fp32_bytes, double ready_ms, double start_ms, double weight = 1,
                              bool record = true) {
    const double bytes = fp32_bytes * wire;
    // ZeRO-1: the ring's two halves; the reduce-scatter (N-1 rounds, P(N-1)/N
    // bytes and all the reduction) here, the all-gather after the optimizer.
    const CollectiveCost c = sharded ? on_this_host(bytes, Algorithm::Ring) : price(bytes);
    const double gather_s = sharded ? (c.alpha_s + c.beta_s) / 2 : 0;
    s.gather_ms += weight * 1e3 * gather_s;
    BucketTime bt{.bytes = bytes, .ready_ms = ready_ms, .start_ms = start_ms};
    bt.end_ms = start_ms + 1e3 * (c.seconds - gather_s);
    s.comm_ms += weight * 1e3 * c.seconds;
    s.alpha_ms += weight * 1e3 * c.alpha_s;
    s.beta_ms += weight * 1e3 * c.beta_s;
    s.gamma_ms += weight * 1e3 * c.gamma_s;
    s.bytes_sent += weight * c.bytes_sent;
    if (record) {
      if (bytes > largest) {
        largest = bytes;
        s.algorithm = c.algorithm;
      }
      s.buckets.push_back(bt);
    }
    return bt.end_ms;
  };

  // Gradient floats per layer, as the trainer's buckets count them.
  std::vector<std::size_t> numels(n);
  for (std::size_t i = 0; i < n; ++i)
    numels[i] = static_cast<std::size_t>(std::llround(profile.layers[i].param_bytes / 4));

  if (o.launch == StepOptions::Launch::Cycles && !(o.cycle_ms > 0 && std::isfinite(o.cycle_ms)))
    throw InvalidArgument("the cycle time must be a positive, finite number of milliseconds.");
  if (o.launch == StepOptions::Launch::Cycles && o.replicas > 1) {
    s.exposed_comm_ms = cycle_steady_state(o, ready, numels, backward_end, s.compute_ms, all_reduce,
                                           &s.negotiation_ms);
    s.step_ms = s.compute_ms + s.exposed_comm_ms;
    return s;
  }
  double stream_free = 0;
  std::vector<ddp::Bucket> buckets;
  if (o.launch != StepOptions::Launch::Buckets) {  // per layer (and Cycles with one replica: nothing to agree on)
    for (std::size_t i = n; i-- > 0;) buckets.push_back({.numel = numels[i], .tensors = {i}});
  } else {
    const auto mib = [](double mb) { return static_cast<std::size_t>(std::llround(mb * (1 << 20))); };
    const bool one = o.one_bucket_on_shared_cores && o.host_cores > 0 && o.replicas >= o.host_cores;
    buckets = ddp::assign_buckets(numels, mib(o.first_bucket_mb), one ? 0 : mib(o.bucket_mb));
  }
  for (const auto& b : buckets) {
    if (b.numel == 0) continue;
    double bucket_ready = 0;
    for (auto i : b.tensors) bucket_ready = std::max(bucket_ready, ready[i]);
    // With no overlap (bucket_mb 0) the one bucket waits for the end of backward anyway.
    stream_free = all_reduce(double(b.bytes()), bucket_ready, std::max(bucket_ready, stream_free));
  }
  s.exposed_comm_ms = std::max(0.0, stream_free - backward_end) + s.gather_ms;
  s.step_ms = s.compute_ms + s.exposed_comm_ms;
  return s;
}

}  // namespace lockstep::cost
