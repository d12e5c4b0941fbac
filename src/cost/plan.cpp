// Rows per replica count and the alternatives' table (lockstep/cost/plan.h).
//
// Efficiency is against one replica at the same micro-batch: one replica
// never communicates, so efficiency = its step time / this step time. Cost
// per sample scales with N x step / (N b), so it rises by 1/efficiency: the
// cost threshold (max_cost_increase) and the efficiency threshold are the
// same test when min_efficiency = 1 / (1 + max_cost_increase), as by default.
#include <algorithm>
#include <cmath>
#include <string>

#include "lockstep/error.h"
#include "plan_internal.h"

namespace lockstep::cost {
namespace {

void check_options(const PlanOptions& o) {
  if (o.replicas.empty()) throw InvalidArgument("give at least one replica count, e.g. --replicas 1-64.");
  for (int n : o.replicas)
    if (n < 1) throw InvalidArgument("replica counts must be at least 1, got " + std::to_string(n) + ".");
  if (!(o.min_efficiency > 0 && o.min_efficiency <= 1))
    throw InvalidArgument("--min-efficiency must be in (0, 1], e.g. 0.8.");
  if (!(o.max_cost_increase >= 0)) throw InvalidArgument("--max-cost-increase must be zero or positive.");
  // Price only scales the costs; at 0 they all tie and the ranking of the
  // remedies would change with it.
  if (!(o.price_per_device_hour > 0))
    throw InvalidArgument("--price must be positive: it scales every cost, and the remedies are ranked by cost per "
                          "sample (any currency; the default is 1 per device-hour).");
  if (!(o.critical_batch >= 0)) throw InvalidArgument("--critical-batch must be zero (none) or positive.");
}

Bound classify(const PlanRow& r, const PlanOptions& o) {
  if (!r.fits) return Bound::Memory;
  if (detail::pays(r, o)) return Bound::Fine;
  if (r.statistical_efficiency < r.systems_efficiency) return Bound::Statistical;
  if (o.step.compute_cv > 0 && r.straggler_loss_ms > r.comm_loss_ms) return Bound::Stragglers;
  const double window = r.step.backward_ms / double(o.step.accumulate);  // the last micro-step's backward
  if (r.step.comm_ms <= window) return Bound::ExposedTail;
  // Bandwidth: the wire's (beta) or memory's, the reduction's arithmetic (gamma).
  return r.step.alpha_ms >= r.step.beta_ms + r.step.gamma_ms ? Bound::Latency : Bound::Bandwidth;
}

}  // namespace

double optimizer_state_factor(Optimizer o) {
  return o == Optimizer::Sgd ? 0 : o == Optimizer::Momentum ? 1 : 2;
}
// Reads p, g (+ state), writes p (+ state).
double optimizer_passes(Optimizer o) {
  return o == Optimizer::Sgd ? 3 : o == Optimizer::Momentum ? 5 : 7;
}
const char* to_string(Optimizer o) {
  return o == Optimizer::Sgd ? "sgd" : o == Optimizer::Momentum ? "sgd with momentum" : "adamw";
}

const char* to_string(Bound b) {
  switch (b) {
    case Bound::Fine:
      return "fine";
    case Bound::Latency:
      return "latency-bound";
    case Bound::Bandwidth:
      return "bandwidth-bound";
    case Bound::ExposedTail:
      return "exposed tail";
    case Bound::Stragglers:
      return "stragglers";
    case Bound::Statistical:
      return "past the critical batch";
    case Bound::Memory:
      return "out of memory";
  }
  return "?";
}

PlanRow plan_row(const Profile& profile, const PlanOptions& o, int replicas) {
  check_options(o);
  StepOptions so = o.step;
  so.replicas = replicas;
  so.optimizer_passes = optimizer_passes(o.optimizer);
  PlanRow r{.replicas = replicas, .step = predict_step(profile, so)};
  so.replicas = 1;
  const double one = predict_step(profile, so).step_ms;
  double even = r.step.step_ms;  // the step if every replica computed for the mean time
  if (so.compute_cv > 0) {
    so.replicas = replicas;
    so.compute_cv = 0;
    even = predict_step(profile, so).step_ms;
  }
  r.straggler_loss_ms = r.step.step_ms - even;
  r.comm_loss_ms = even - one;
  const double local_batch = double(o.step.micro_batch) * double(o.step.accumulate);
  r.systems_efficiency = one / r.step.step_ms;
  const double reference = o.reference_batch > 0 ? o.reference_batch : local_batch;
  if (o.critical_batch > 0)
    r.statistical_efficiency = (reference + o.critical_batch) / (replicas * local_batch + o.critical_batch);
  r.efficiency = r.systems_efficiency * r.statistical_efficiency;
  r.samples_per_s = replicas * local_batch / (r.step.step_ms / 1e3);
  r.cost_per_million_samples = o.price_per_device_hour * replicas / 3600 / r.samples_per_s * 1e6;
  r.cost_per_million_useful_samples = r.cost_per_million_samples / r.statistical_efficiency;
  const double p = profile.param_bytes();
  r.memory = {.weights = p,
              .gradients = p,
              .optimizer_state = p * optimizer_state_factor(o.optimizer) / (o.step.zero1 ? replicas : 1),
              .activations = profile.activation_bytes_per_sample * double(o.step.micro_batch)};
  r.fits = o.device.memory_bytes <= 0 || r.memory.total() <= o.device.memory_bytes;
  r.bound = classify(r, o);
  return r;
}

namespace detail {

double efficiency_floor(const PlanOptions& o) { return std::max(o.min_efficiency, 1 / (1 + o.max_cost_increase)); }

bool pays(const PlanRow& r, const PlanOptions& o) { return r.fits && r.efficiency >= efficiency_floor(o) * (1 - 1e-12); }

Alternative as_alternative(const PlanRow& r, std::string name, std::string detail) {
  return {.name = std::move(name),
          .detail = std::move(detail),
          .replicas = r.replicas,
          .step_ms = r.step.step_ms,
          .efficiency = r.efficiency,
          .samples_per_s = r.samples_per_s,
          .cost_per_million_useful_samples = r.cost_per_million_useful_samples,
          .memory_bytes_per_device = r.memory.total(),
          .comm_bytes_per_step = r.step.bytes_sent,
          .fits = r.fits};
}

std::vector<Alternative> alternatives_at(const Profile& profile, const PlanOptions& o, int n) {
  const PlanRow base = plan_row(profile, o, n);
  std::vector<Alternative> out{
      as_alternative(base, o.step.zero1 ? "data parallel, ZeRO-1" : "data parallel", "as planned")};
  // The ZeRO-2 and -3 outlines start from replicated data parallelism, also
  // when the plan is ZeRO-1 (--zero 1).
  PlanOptions replicated = o;
  replicated.step.zero1 = false;
  const PlanRow dp = o.step.zero1 ? plan_row(profile, replicated, n) : base;
  const Memory& m = dp.memory;
  const double limit = o.device.memory_bytes;
  auto with_step = [&](std::string name, std::string detail, double step_ms, double memory,
                       double comm_bytes) {
    Alternative a = as_alternative(base, std::move(name), std::move(detail));
    a.step_ms = step_ms;
    a.efficiency = base.efficiency * base.step.step_ms / step_ms;
    a.samples_per_s = base.samples_per_s * base.step.step_ms / step_ms;
    a.cost_per_million_useful_samples = base.cost_per_million_useful_samples * step_ms / base.step.step_ms;
    a.memory_bytes_per_device = memory;
    a.comm_bytes_per_step = comm_bytes;
    a.fits = limit <= 0 || memory <= limit;
    return a;
  };
  const double c = dp.step.comm_ms, sent = dp.step.bytes_sent;
  // ZeRO (Rajbhandari et al. 2020), with k = --accumulate micro-steps per
  // step. Stage 1 keeps whole gradients: they accumulate locally, and one
  // reduce-scatter in backward hides as the all-reduce did; the all-gather of
  // the updated parameters after the optimizer cannot hide (DeepSpeed's
  // default), +c/2 (or as predict_step prices lockstep's --zero 1, below).
  // Stage 2 keeps only its shard of the gradients, so every micro-step
  // reduce-scatters: stage 1's step, and the k-1 more exposed in the
  // proportion stage 1's was. Stage 3 also gathers each layer's
  // parameters before every micro-step's forward (prefetched, hidden behind
  // that forward when it fits) and again in its backward, where the gather
  // and the reduce-scatter are exposed in the same proportion: 1.5x the
  // bytes per micro-step.
  const double k = double(o.step.accumulate);
  // Under Horovod's cycles the exposed time also holds the wait for a cycle: at most all of c.
  const double exposed_share = c > 0 ? std::min(1.0, dp.step.exposed_comm_ms / c) : 0;
  // All three stages are priced on one reduce-scatter and all-gather, so
  // that they compare with each other: ZeRO-1's. That is lockstep's --zero 1
  // (the ring's two halves, predict_step) where the plan's own schedule
  // allows it (buckets, float32), else the outline: half the replicated
  // all-reduce each (c/2), the reduce-scatter exposed as the all-reduce was
  // (share e), the all-gather whole.
  // (ZeRO-3 was priced on the replicated all-reduce while ZeRO-1 and -2 ran
  // lockstep's flat ring: across 64 nodes it came out 2.8x faster than
  // ZeRO-2 for 1.5x the bytes.)
  struct Sharded {
    double step_ms;      // ZeRO-1's step
    double scatter_ms;   // one reduce-scatter of the gradients
    double gather_ms;    // one all-gather of the weights, exposed whole after the optimizer
    double scatter_exposed_share;
  } z1{};
  if (o.step.launch == StepOptions::Launch::Buckets && !o.step.bf16) {
    PlanRow row = base;  // planned --zero 1 already
    if (!o.step.zero1) {
      PlanOptions z = o;
      z.step.zero1 = true;
      row = plan_row(profile, z, n);
      out.push_back(as_alternative(row, "ZeRO-1", "optimizer state sharded over the replicas (lockstep train --zero 1)"));
    }
    const double gather = row.step.gather_ms, scatter = row.step.comm_ms - gather;
    z1 = {.step_ms = row.step.step_ms,
          .scatter_ms = scatter,
          .gather_ms = gather,
          .scatter_exposed_share =
              scatter > 0 ? std::clamp((row.step.exposed_comm_ms - gather) / scatter, 0.0, 1.0) : 0};
  } else {
    // The all-reduce's exposed part c e becomes the reduce-scatter's, c/2 e,
    // and the all-gather after the optimizer is exposed whole, c/2.
    z1 = {.step_ms = dp.step.step_ms - c * exposed_share / 2 + c / 2,
          .scatter_ms = c / 2,
          .gather_ms = c / 2,
          .scatter_exposed_share = exposed_share};
    out.push_back(with_step("ZeRO-1", "optimizer state sharded over the replicas", z1.step_ms,
                            m.weights + m.gradients + m.optimizer_state / n + m.activations, sent));
  }
  // Stage 2 reduce-scatters every micro-step: ZeRO-1's step and k-1 more.
  const double rs = z1.scatter_ms, ag = z1.gather_ms, es = z1.scatter_exposed_share;
  out.push_back(with_step("ZeRO-2", "optimizer state and gradients sharded", z1.step_ms + (k - 1) * rs * es,
                          m.weights + (m.gradients + m.optimizer_state) / n + m.activations, sent * (k + 1) / 2));
  // Stage 3 has no all-gather after the optimizer. Each micro-step gathers
  // the weights before forward (hidden behind it where it fits), and again
  // in backward, exposed as its reduce-scatter is.
  const double compute_ms = z1.step_ms - ag - rs * es;  // ZeRO-1's step without its exposed communication
  const double z3 = compute_ms + k * std::max(0.0, ag - dp.step.forward_ms / k) + k * (rs + ag) * es;
  out.push_back(with_step("ZeRO-3", "weights, gradients and optimizer state sharded", z3,
                          (m.weights + m.gradients + m.optimizer_state) / n + m.activations, 1.5 * sent * k));
  for (std::int64_t k : {4}) {
    PlanOptions a = o;
    a.step.accumulate = o.step.accumulate * k;
    out.push_back(as_alternative(plan_row(profile, a, n), "accumulate " + std::to_string(a.step.accumulate),
                                 "one all-reduce per " + std::to_string(a.step.accumulate) +
                                     " micro-batches; x" + std::to_string(k) + " the planned global batch"));
  }
  if (!o.step.bf16) {
    PlanOptions a = o;
    a.step.bf16 = true;
    a.step.zero1 = false;  // lockstep compresses replicated training only
    out.push_back(as_alternative(plan_row(profile, a, n), "bf16 compression",
                                 o.step.zero1 ? "half the bytes on the wire; replicated optimizer state"
                                              : "half the bytes on the wire"));
  }
  // In outline: memory and what crosses the link, no step time.
  const int t = o.step.topology.per_node > 1 ? std::min(o.step.topology.per_node, 8) : 2;
  Alternative tp{.name = "tensor parallel x" + std::to_string(t),
                 .detail = "each layer split over " + std::to_string(t) +
                           " devices; ~4 all-reduces of activations per layer per micro-batch, needs the "
                           "intra-node link",
                 .replicas = n,
                 .memory_bytes_per_device = (m.weights + m.gradients + m.optimizer_state) / t + m.activations,
                 .outline = true};
  tp.fits = limit <= 0 || tp.memory_bytes_per_device <= limit;
  out.push_back(tp);
  // Up to 4 stages, no more than the model has layers.
  const int s = static_cast<int>(std::min<std::size_t>(4, profile.layers.size())), micro = 4 * s;
  if (s < 2) return out;
  Alternative pp{.name = "pipeline x" + std::to_string(s),
                 .detail = "layers split into " + std::to_string(s) + " stages, " + std::to_string(micro) +
                           " micro-batches per step: bubble " +
                           std::to_string(int(std::lround(100.0 * (s - 1) / (micro + s - 1)))) +
                           "% of the step; activations cross stage boundaries",
                 .replicas = n,
                 .efficiency = 1.0 - double(s - 1) / (micro + s - 1),
                 .memory_bytes_per_device = (m.weights + m.gradients + m.optimizer_state) / s + m.activations,
                 .outline = true};
  pp.fits = limit <= 0 || pp.memory_bytes_per_device <= limit;
  out.push_back(pp);
  return out;
}

}  // namespace detail

Plan make_plan(const Profile& profile, const PlanOptions& given) {
  check_options(given);
  PlanOptions options = given;
  // The advisor reads the rows in order (the last that pays, the first that
  // fails): ascending, each count once, whatever order they came in.
  std::sort(options.replicas.begin(), options.replicas.end());
  options.replicas.erase(std::unique(options.replicas.begin(), options.replicas.end()), options.replicas.end());
  if (options.reference_batch <= 0)
    options.reference_batch = double(options.step.micro_batch) * double(options.step.accumulate);
  Plan plan{.model = profile.model, .profile = profile, .options = options};
  for (int n : options.replicas) plan.rows.push_back(plan_row(profile, options, n));
  plan.recommendation = detail::advise(profile, options, plan.rows);
  const int target =
      plan.recommendation.first_failing > 0 ? plan.recommendation.first_failing : options.replicas.back();
  plan.alternatives = detail::alternatives_at(profile, options, target);
  return plan;
}

}  // namespace lockstep::cost
