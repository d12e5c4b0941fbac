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
#include <string>

#include "lockstep/ddp/reducer.h"
#include "lockstep/error.h"

namespace lockstep::cost {

double core_sharing(int replicas, int host_cores) {
  if (host_cores <= 0 || replicas <= host_cores) return 1;
  return double(replicas) / double(host_cores);
}

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
  if (profile.layers.empty() || profile.param_bytes() <= 0 || profile.micro_batch < 1)
    throw InvalidArgument("the model has no parameters, so there is nothing to all-reduce.");

  const double f = core_sharing(o.replicas, o.host_cores);
  const double scale = double(o.micro_batch) / double(profile.micro_batch);
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
  s.optimizer_ms = f * profile.optimizer_ms();
  s.compute_ms = s.forward_ms + s.backward_ms + s.optimizer_ms;

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
  const auto on_this_host = [&](double bytes, Algorithm a) {
    CollectiveCost c = allreduce_cost(bytes, o.replicas, o.topology, a, o.reduce_bytes_per_s);
    c.alpha_s += c.rounds * f * o.host_latency_s;
    c.seconds = c.alpha_s + c.beta_s + c.gamma_s;
    if (f > 1 && f * c.gamma_s > c.seconds) {
      const double extra = f * c.gamma_s - c.seconds;
      c.gamma_s += extra;
      c.seconds += extra;
    }
    return c;
  };
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
  double largest = -1;
  const auto all_reduce = [&](double fp32_bytes, double ready_ms, double start_ms) {
    const double bytes = fp32_bytes * (o.bf16 ? 0.5 : 1.0);
    const CollectiveCost c = price(bytes);
    BucketTime bt{.bytes = bytes, .ready_ms = ready_ms, .start_ms = start_ms};
    bt.end_ms = start_ms + 1e3 * c.seconds;
    s.comm_ms += 1e3 * c.seconds;
    s.alpha_ms += 1e3 * c.alpha_s;
    s.beta_ms += 1e3 * c.beta_s;
    s.gamma_ms += 1e3 * c.gamma_s;
    s.bytes_sent += c.bytes_sent;
    if (bytes > largest) {
      largest = bytes;
      s.algorithm = c.algorithm;
    }
    s.buckets.push_back(bt);
    return bt.end_ms;
  };

  // Gradient floats per layer, as the trainer's buckets count them.
  std::vector<std::size_t> numels(n);
  for (std::size_t i = 0; i < n; ++i)
    numels[i] = static_cast<std::size_t>(std::llround(profile.layers[i].param_bytes / 4));
  const auto numels_of = [&](std::size_t i) { return numels[i]; };

  double stream_free = 0;
  if (o.launch == StepOptions::Launch::Cycles && !(o.cycle_ms > 0))
    throw InvalidArgument("the cycle time must be positive milliseconds.");
  if (o.launch == StepOptions::Launch::Cycles && o.replicas > 1) {
    // Agreeing on what is ready: a binomial-tree gather to rank 0 and a
    // broadcast back, log2(G) rounds inside a node and log2(M) across nodes.
    const int g = std::max(1, std::min(o.topology.per_node, o.replicas));
    const int m = (o.replicas + g - 1) / g;
    const auto lg = [](int x) { return std::ceil(std::log2(double(std::max(1, x)))); };
    const double negotiation = 1e3 * 2 *
                               (lg(g) * (o.topology.intra.latency_s + f * o.host_latency_s) +
                                lg(m) * (o.topology.inter.latency_s + f * o.host_latency_s));
    const double cap = double(std::llround(o.bucket_mb * (1 << 20)));
    struct Launched {
      double bytes, ready_ms, start_ms;
    };
    // The thread's cycles are not aligned with the step: the first one begins
    // at `phase`. A cycle that finds gradients ready pays the negotiation,
    // then all-reduces them, fused in order into buffers of at most `cap` (a
    // bigger layer goes alone). The next cycle begins cycle_ms after this one
    // began, or when its all-reduces end if that is later.
    const auto schedule = [&](double phase, double* end_ms, int* cycles) {
      std::vector<Launched> out;
      std::size_t pending = n;  // layers [0, pending) still to send; backward readies them from the top
      double cycle = phase, t = 0;
      *cycles = 0;
      while (pending > 0) {
        if (ready[pending - 1] > cycle) {  // nothing ready: sleep to the first cycle after it is
          cycle += o.cycle_ms * std::ceil((ready[pending - 1] - cycle) / o.cycle_ms);
          continue;
        }
        t = cycle + negotiation;
        ++*cycles;
        while (pending > 0 && ready[pending - 1] <= cycle) {
          Launched l{.bytes = 0, .ready_ms = 0, .start_ms = t};
          while (pending > 0 && ready[pending - 1] <= cycle) {
            const double b = double(numels_of(pending - 1)) * 4;
            if (l.bytes > 0 && cap > 0 && l.bytes + b > cap) break;
            l.bytes += b;
            l.ready_ms = std::max(l.ready_ms, ready[pending - 1]);
            --pending;
          }
          t += 1e3 * price(l.bytes * (o.bf16 ? 0.5 : 1.0)).seconds;
          out.push_back(l);
        }
        cycle = std::max(t, cycle + o.cycle_ms);
      }
      *end_ms = t;
      return out;
    };
    // The phase is arbitrary, so take the schedule whose end is the median
    // over kPhases evenly spaced phases (the upper middle).
    constexpr int kPhases = 16;
    std::vector<std::pair<double, double>> ends;  // (end, phase)
    for (int k = 0; k < kPhases; ++k) {
      const double phase = (k + 0.5) * o.cycle_ms / kPhases;
      double end_ms = 0;
      int cycles = 0;
      schedule(phase, &end_ms, &cycles);
      ends.emplace_back(end_ms, phase);
    }
    std::nth_element(ends.begin(), ends.begin() + kPhases / 2, ends.end());
    double end_ms = 0;
    int cycles = 0;
    for (const Launched& l : schedule(ends[kPhases / 2].second, &end_ms, &cycles))
      all_reduce(l.bytes, l.ready_ms, l.start_ms);
    s.negotiation_ms = cycles * negotiation;
    stream_free = end_ms;
  } else {
    std::vector<ddp::Bucket> buckets;
    if (o.launch == StepOptions::Launch::PerLayer) {
      for (std::size_t i = n; i-- > 0;) buckets.push_back({.numel = numels[i], .tensors = {i}});
    } else {
      const auto mib = [](double mb) { return static_cast<std::size_t>(std::llround(mb * (1 << 20))); };
      buckets = ddp::assign_buckets(numels, mib(o.first_bucket_mb), mib(o.bucket_mb));
    }
    for (const auto& b : buckets) {
      if (b.numel == 0) continue;
      double bucket_ready = 0;
      for (auto i : b.tensors) bucket_ready = std::max(bucket_ready, ready[i]);
      // With no overlap (bucket_mb 0) the one bucket waits for the end of backward anyway.
      stream_free = all_reduce(double(b.bytes()), bucket_ready, std::max(bucket_ready, stream_free));
    }
  }
  s.exposed_comm_ms = std::max(0.0, stream_free - backward_end);
  s.step_ms = s.compute_ms + s.exposed_comm_ms;
  return s;
}

}  // namespace lockstep::cost
