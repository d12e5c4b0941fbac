// One step's timeline under bucketed overlap (lockstep/cost/step_cost.h).
//
// Backward runs the layers last to first. With accumulation, the all-reduce
// happens in the last micro-step only, so every earlier micro-step is pure
// compute. The buckets are ddp::assign_buckets' own, over one tensor per
// layer, so the plan and the trainer agree on what is launched when.
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

  std::vector<std::size_t> numels(n);
  for (std::size_t i = 0; i < n; ++i)
    numels[i] = static_cast<std::size_t>(std::llround(profile.layers[i].param_bytes / 4));
  const auto mib = [](double mb) { return static_cast<std::size_t>(std::llround(mb * (1 << 20))); };
  const auto buckets = ddp::assign_buckets(numels, mib(o.first_bucket_mb), mib(o.bucket_mb));

  double stream_free = 0, largest = -1;
  for (const auto& b : buckets) {
    if (b.numel == 0) continue;
    double bucket_ready = 0;
    for (auto i : b.tensors) bucket_ready = std::max(bucket_ready, ready[i]);
    // With no overlap (bucket_mb 0) the one bucket waits for the end of backward anyway.
    const double bytes = double(b.bytes()) * (o.bf16 ? 0.5 : 1.0);
    // The host's terms on top of the link's: f x h per round, and the N
    // replicas' reductions on C cores (at least f x gamma).
    auto on_this_host = [&](Algorithm a) {
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
    CollectiveCost c = on_this_host(o.algorithm);
    if (o.algorithm == Algorithm::Best) {  // the cheapest with the host's terms, not before them
      for (Algorithm a : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree, Algorithm::Hierarchical}) {
        const CollectiveCost other = on_this_host(a);
        if (other.seconds < c.seconds * (1 - 1e-12)) c = other;
      }
    }
    BucketTime bt{.bytes = bytes, .ready_ms = bucket_ready};
    bt.start_ms = std::max(bucket_ready, stream_free);
    bt.end_ms = bt.start_ms + 1e3 * c.seconds;
    stream_free = bt.end_ms;
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
  }
  s.exposed_comm_ms = std::max(0.0, stream_free - backward_end);
  s.step_ms = s.compute_ms + s.exposed_comm_ms;
  return s;
}

}  // namespace lockstep::cost
