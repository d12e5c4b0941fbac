// The plan as a table a person reads (lockstep/cost/render.h).
#include <chrono>
#include <cmath>
#include <string>

#include "format.h"
#include "lockstep/comm/modelled_link.h"
#include "lockstep/cost/render.h"

namespace lockstep::cost {
namespace {

using detail::bytes_text;
using detail::rate_text;
using detail::strf;

// As lockstep train prints its modelled link: "10 Gbit/s, 50 us", "1 Gbit/s, 1 ms".
std::string link_text(const Link& l) {
  return comm::LinkModel{.bytes_per_second = l.bytes_per_second,
                         .latency = std::chrono::nanoseconds(std::llround(l.latency_s * 1e9))}
      .describe();
}

// Wraps at ~100 columns with a hanging indent.
std::string wrap(const std::string& text, const std::string& indent) {
  std::string out, line;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t sp = text.find(' ', pos);
    if (sp == std::string::npos) sp = text.size();
    const std::string word = text.substr(pos, sp - pos);
    if (!line.empty() && line.size() + 1 + word.size() > 100 - indent.size()) {
      out += indent + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    pos = sp + 1;
  }
  if (!line.empty()) out += indent + line + "\n";
  return out;
}

}  // namespace

std::string plan_table(const Plan& plan) {
  const PlanOptions& o = plan.options;
  const StepOptions& s = o.step;
  std::string t = strf("lockstep plan: %s, %s of gradients, %s compute per step at micro-batch %lld\n",
                       plan.model.c_str(), bytes_text(plan.profile.param_bytes()).c_str(),
                       detail::ms_text(plan.rows.empty() ? 0.0 : plan.rows.front().step.compute_ms).c_str(),
                       (long long)s.micro_batch);
  const std::string flops = o.device.flops >= 1e12 ? strf("%.3g TFLOP/s", o.device.flops / 1e12)
                                                   : strf("%.3g GFLOP/s", o.device.flops / 1e9);
  t += strf("device %s (%s achieved, %s); ", o.device.name.c_str(), flops.c_str(),
            detail::memory_text(o.device.memory_bytes).c_str());
  if (s.topology.per_node > 1)
    t += strf("%d per node on %s, nodes on %s", s.topology.per_node, link_text(s.topology.intra).c_str(),
              link_text(s.topology.inter).c_str());
  else
    t += "link " + link_text(s.topology.inter);
  const std::string launch =
      s.launch == StepOptions::Launch::PerLayer ? std::string("one per layer")
      : s.launch == StepOptions::Launch::Cycles
          ? (s.bucket_mb > 0 ? strf("fused every %.3g ms up to %.3g MiB", s.cycle_ms, s.bucket_mb)
                             : strf("every %.3g ms, not fused", s.cycle_ms))
          : s.bucket_mb == 0  // one bucket, whatever the first bucket's cap (assign_buckets)
              ? std::string("one bucket (--bucket-mb 0)")
              : strf("buckets %.3g/%.3g MiB%s", s.first_bucket_mb, s.bucket_mb,
                 s.one_bucket_on_shared_cores && s.host_cores > 0
                     ? strf(" (one where the replicas fill the %d cores, as lockstep train)", s.host_cores).c_str()
                     : "");
  const std::string algorithm =
      s.zero1 ? "ring reduce-scatter + all-gather (--zero 1: optimizer state sharded)" : to_string(s.algorithm);
  t += strf("\nall-reduce %s, %s%s, accumulate %lld, %s, %.3g per device-hour", algorithm.c_str(),
            launch.c_str(), s.bf16 ? ", bf16" : "",
            (long long)s.accumulate, to_string(o.optimizer), o.price_per_device_hour);
  if (o.critical_batch > 0) t += strf(", critical batch %.0f", o.critical_batch);
  if (s.compute_cv > 0) t += strf(", compute varies by %.3g (stragglers)", s.compute_cv);
  t += "\n\n";
  // With a critical batch, the cost counts useful samples (McCandlish et al.'s worth of a sample).
  const char* cost_column = o.critical_batch > 0 ? "cost/M useful" : "cost/M samples";
  t +=
      strf("%8s %10s %10s %9s %10s %10s %11s %14s %13s  %s\n", "replicas", "step_ms", "compute_ms", "comm_ms",
           "exposed_ms", "efficiency", "samples/s", cost_column, "memory/device", "limited by");
  for (const PlanRow& r : plan.rows)
    t += strf("%8d %10.3f %10.3f %9.3f %10.3f %10.3f %11s %14.4g %13s  %s\n", r.replicas, r.step.step_ms,
              r.step.compute_ms, r.step.comm_ms, r.step.exposed_comm_ms, r.efficiency, rate_text(r.samples_per_s).c_str(),
              r.cost_per_million_useful_samples, bytes_text(r.memory.total()).c_str(), to_string(r.bound));

  if (!plan.alternatives.empty()) {
    t += strf("\nAlternatives at %d %s:\n", plan.alternatives.front().replicas,
              plan.alternatives.front().replicas == 1 ? "replica" : "replicas");
    t += strf("  %-22s %10s %10s %11s %14s %13s %12s  %s\n", "", "step_ms", "efficiency", "samples/s",
              cost_column, "memory/device", "comm/step", "");
    for (const Alternative& a : plan.alternatives) {
      const std::string fit = a.fits ? "" : " (does not fit)";
      if (a.outline)
        t += strf("  %-22s %10s %10s %11s %14s %13s %12s  %s%s\n", a.name.c_str(), "-",
                  a.efficiency > 0 ? strf("~%.2f", a.efficiency).c_str() : "-", "-", "-",
                  bytes_text(a.memory_bytes_per_device).c_str(), "-", a.detail.c_str(), fit.c_str());
      else
        t += strf("  %-22s %10.3f %10.3f %11s %14.4g %13s %12s  %s%s\n", a.name.c_str(), a.step_ms,
                  a.efficiency, rate_text(a.samples_per_s).c_str(), a.cost_per_million_useful_samples,
                  bytes_text(a.memory_bytes_per_device).c_str(), bytes_text(a.comm_bytes_per_step).c_str(),
                  a.detail.c_str(), fit.c_str());
    }
  }

  const Recommendation& rec = plan.recommendation;
  t += "\nRecommendation:\n" + wrap(rec.summary, "  ");
  if (!rec.ranked.empty()) {
    t += strf("  What to do instead at %d %s, those that pay first, then by cost per useful sample:\n", rec.first_failing,
              rec.first_failing == 1 ? "replica" : "replicas");
    int i = 0;
    for (const Alternative& a : rec.ranked) {
      if (++i > 6) break;
      if (a.outline)
        t += strf("  %d. %s: %s%s\n", i, a.name.c_str(), a.detail.c_str(), a.fits ? "" : " (does not fit)");
      else
        t += strf("  %d. %s: efficiency %.2f, %.4g %s, %s samples/s%s\n", i, a.name.c_str(), a.efficiency,
                  a.cost_per_million_useful_samples, detail::per_million(o.critical_batch > 0),
                  rate_text(a.samples_per_s).c_str(),
                  a.fits ? "" : " (does not fit)");
    }
  }
  return t;
}

}  // namespace lockstep::cost
