// The advisor: where data parallelism stops paying, why, and what to do
// instead, ranked by predicted cost per useful sample.
#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

#include "format.h"
#include "plan_internal.h"

namespace lockstep::cost::detail {
namespace {

std::string why_text(const Profile& profile, const PlanOptions& o, const PlanRow& r) {
  const StepPrediction& s = r.step;
  const double window = s.backward_ms / double(o.step.accumulate);
  // Under Horovod's cycles the exposed time also holds the wait for a cycle.
  const std::string cycle_note =
      o.step.launch == StepOptions::Launch::Cycles
          ? strf(" The exposed time includes waiting for the next fusion cycle (every %s).",
                 ms_text(o.step.cycle_ms).c_str())
          : "";
  switch (r.bound) {
    case Bound::Fine:
      return "";
    case Bound::Memory:
      return strf(
          "each device needs %s (weights %s, gradients %s, optimizer state %s, activations %s) but has %s.",
          bytes_text(r.memory.total()).c_str(), bytes_text(r.memory.weights).c_str(),
          bytes_text(r.memory.gradients).c_str(), bytes_text(r.memory.optimizer_state).c_str(),
          bytes_text(r.memory.activations).c_str(), memory_text(o.device.memory_bytes).c_str());
    case Bound::Statistical:
      return strf(
          "past the critical batch: the global batch of %.0f is no longer small against B_crit = %.0f, so by "
          "McCandlish et al. (2018) a sample is worth only %.2f of one at one replica's batch; the "
          "efficiency "
          "is %.2f although the systems efficiency is %.2f.",
          double(r.replicas) * o.step.micro_batch * o.step.accumulate, o.critical_batch,
          r.statistical_efficiency, r.efficiency, r.systems_efficiency);
    case Bound::Stragglers:
      return strf(
          "stragglers: each step waits for the slowest of %d replicas. With compute varying by %.3g (coefficient "
          "of variation), the slowest computes %.1f%% longer than the mean, and the step takes %s longer than "
          "with equal replicas: more than the %s that communication adds to one replica's step.",
          r.replicas, o.step.compute_cv,
          100 * s.straggler_ms / std::max(1e-12, s.forward_ms + s.backward_ms - s.straggler_ms),
          ms_text(r.straggler_loss_ms).c_str(), ms_text(r.comm_loss_ms).c_str());
    case Bound::Latency:
      return strf(
          "latency-bound: %s of the %s all-reduce time is message latency (%s a step, %zu bucket(s)), and "
          "%s of it is exposed after backward, against %s of compute.",
          ms_text(s.alpha_ms).c_str(), ms_text(s.comm_ms).c_str(), to_string(s.algorithm), s.buckets.size(),
          ms_text(s.exposed_comm_ms).c_str(), ms_text(s.compute_ms).c_str()) +
             cycle_note;
    case Bound::Bandwidth:
      if (s.gamma_ms > s.beta_ms) {  // the link is fast: adding the gradients up in memory is the cost
        return strf(
            "bandwidth-bound, on memory rather than the link: each replica sends %s of gradients a step (%s "
            "all-reduce of %s), which takes %s, of which %s is adding them up through memory (gamma) and only "
            "%s the link; more than the %s backward pass can hide; %s is exposed against %s of compute.",
            bytes_text(s.bytes_sent).c_str(), to_string(s.algorithm), bytes_text(profile.param_bytes()).c_str(),
            ms_text(s.comm_ms).c_str(), ms_text(s.gamma_ms).c_str(), ms_text(s.beta_ms).c_str(),
            ms_text(window).c_str(), ms_text(s.exposed_comm_ms).c_str(), ms_text(s.compute_ms).c_str()) +
               cycle_note;
      }
      return strf(
          "bandwidth-bound: each replica sends %s of gradients a step (%s all-reduce of %s), which takes %s, "
          "more than the %s backward pass can hide; %s is exposed against %s of compute.",
          bytes_text(s.bytes_sent).c_str(), to_string(s.algorithm), bytes_text(profile.param_bytes()).c_str(),
          ms_text(s.comm_ms).c_str(), ms_text(window).c_str(), ms_text(s.exposed_comm_ms).c_str(),
          ms_text(s.compute_ms).c_str()) +
             cycle_note;
    case Bound::ExposedTail: {
      if (o.step.launch == StepOptions::Launch::Cycles)
        return strf(
            "exposed tail: the all-reduces (%s) are shorter than backward (%s), but the last gradients wait "
            "for the next fusion cycle (every %s) and for the ranks to agree on what is ready (%s a step), so "
            "%s is exposed against %s of compute.",
            ms_text(s.comm_ms).c_str(), ms_text(window).c_str(), ms_text(o.step.cycle_ms).c_str(),
            ms_text(s.negotiation_ms).c_str(), ms_text(s.exposed_comm_ms).c_str(), ms_text(s.compute_ms).c_str());
      const double tail = s.buckets.empty() ? 0 : s.buckets.back().bytes;
      return strf(
          "exposed tail: the all-reduces (%s) are shorter than backward (%s), but the last bucket (%s, the "
          "first layers' gradients) is only ready when backward ends, so %s is exposed against %s of "
          "compute.",
          ms_text(s.comm_ms).c_str(), ms_text(window).c_str(), bytes_text(tail).c_str(),
          ms_text(s.exposed_comm_ms).c_str(), ms_text(s.compute_ms).c_str());
    }
  }
  return "";
}

std::vector<Alternative> remedies(const Profile& profile, const PlanOptions& o, const PlanRow& r,
                                  int max_replicas) {
  std::vector<Alternative> out;
  for (std::int64_t m : {2, 4, 8}) {
    PlanOptions a = o;
    a.step.micro_batch = o.step.micro_batch * m;
    const PlanRow row = plan_row(profile, a, r.replicas);
    if (!row.fits) continue;
    out.push_back(as_alternative(row, "raise --micro-batch to " + std::to_string(a.step.micro_batch),
                                 "same communication, " + std::to_string(m) + "x the compute per step"));
    out.back().micro_batch = a.step.micro_batch;  // in the JSON, not only in the name
    out.back().accumulate = a.step.accumulate;
  }
  // With one replica nothing is communicated: accumulating and compressing change nothing.
  for (std::int64_t k : {2, 4, 8}) {
    if (r.replicas == 1) break;
    PlanOptions a = o;
    a.step.accumulate = o.step.accumulate * k;
    out.push_back(
        as_alternative(plan_row(profile, a, r.replicas), "--accumulate " + std::to_string(a.step.accumulate),
                       "one all-reduce per " + std::to_string(a.step.accumulate) + " micro-batches"));
    out.back().micro_batch = a.step.micro_batch;
    out.back().accumulate = a.step.accumulate;
  }
  if (!o.step.bf16 && r.replicas > 1) {  // lockstep compresses replicated training only
    PlanOptions a = o;
    a.step.bf16 = true;
    a.step.zero1 = false;
    out.push_back(as_alternative(plan_row(profile, a, r.replicas),
                                 o.step.zero1 ? "--zero 0 --compress bf16" : "--compress bf16",
                                 o.step.zero1 ? "half the bytes on the wire, the optimizer state replicated again"
                                              : "half the bytes on the wire"));
  }
  // Latency paid per all-reduce: fewer, bigger all-reduces pay it fewer times.
  if (r.bound == Bound::Latency && o.step.launch == StepOptions::Launch::Buckets && o.step.bucket_mb > 0 &&
      r.step.buckets.size() > 1) {
    PlanOptions a = o;
    a.step.bucket_mb = 0;
    out.push_back(as_alternative(plan_row(profile, a, r.replicas), "--bucket-mb 0",
                                 "one all-reduce per step: its latency once, no overlap"));
  }
  // Another algorithm: with a fixed one (--algorithm ring, ...), the one
  // `best` picks for the step's largest bucket (fewer rounds pay latency
  // fewer times: halving-doubling's 2 log2 N against the ring's 2(N-1);
  // across nodes, the hierarchical all-reduce), named as lockstep train
  // takes it, if it makes the step shorter; latency-bound, also with one
  // bucket.
  if (r.replicas > 1 && o.step.algorithm != Algorithm::Best && o.step.algorithm != Algorithm::Auto) {
    PlanOptions a = o;
    a.step.algorithm = Algorithm::Best;
    a.step.algorithm = plan_row(profile, a, r.replicas).step.algorithm;
    const PlanRow row = plan_row(profile, a, r.replicas);
    if (a.step.algorithm != o.step.algorithm && row.step.step_ms < r.step.step_ms * (1 - 1e-9)) {
      const std::string flag = std::string("--algorithm ") + to_string(a.step.algorithm);
      out.push_back(as_alternative(row, flag, std::string("fewer rounds or bytes than ") + to_string(o.step.algorithm)));
      if (r.bound == Bound::Latency && o.step.launch == StepOptions::Launch::Buckets && o.step.bucket_mb > 0 &&
          r.step.buckets.size() > 1) {
        a.step.bucket_mb = 0;
        out.push_back(as_alternative(plan_row(profile, a, r.replicas), flag + " --bucket-mb 0",
                                     "one all-reduce per step, with it: its latency once"));
      }
    }
  }
  if (o.step.launch == StepOptions::Launch::Cycles && o.step.cycle_ms > 1) {
    PlanOptions a = o;
    a.step.cycle_ms = 1;
    out.push_back(as_alternative(plan_row(profile, a, r.replicas), "--cycle-ms 1",
                                 "gradients wait less for a cycle (Horovod's default since 0.21)"));
  }
  // Sharding needs replicas to shard over: each ZeRO stage at the count
  // (2, 4, 8 ... 65536, and the listed ones) and the micro-batch (the planned
  // one, halved while it divides) that fit and cost the least per useful
  // sample, named with both (ZeRO shards the state, smaller micro-batches
  // shrink the activations: together they fit where neither does alone).
  // The outlines split the model, not the batch: at this count.
  if (r.bound == Bound::Memory) {
    // Activations grow with the micro-batch; weights, gradients and optimizer
    // state do not, and sharding them (ZeRO) leaves activations whole. The
    // planned global batch in smaller micro-batches, accumulated: the
    // largest that fits.
    // If none fits, the smallest is listed all the same (marked as not
    // fitting), so that the least any option needs is on the list.
    const std::int64_t mb = o.step.micro_batch;
    std::vector<std::int64_t> splits;  // micro-batch mb / m, m micro-steps as many: 1, 2, 4 ... while m divides mb
    for (std::int64_t m = 1; m <= mb && mb % m == 0; m *= 2) splits.push_back(m);
    const auto split = [&](std::int64_t m) {
      PlanOptions a = o;
      a.step.micro_batch = mb / m;
      a.step.accumulate = o.step.accumulate * m;
      return a;
    };
    const auto split_name = [&](std::int64_t m) {
      return "--micro-batch " + std::to_string(mb / m) + " --accumulate " + std::to_string(o.step.accumulate * m);
    };
    std::optional<Alternative> smaller;
    for (std::size_t i = 1; i < splits.size(); ++i) {
      const std::int64_t m = splits[i];
      const PlanOptions a = split(m);
      smaller = as_alternative(plan_row(profile, a, r.replicas), split_name(m),
                               "the same global batch in " + std::to_string(a.step.accumulate) +
                                   " micro-steps: 1/" + std::to_string(m) + " of the activations");
      smaller->micro_batch = a.step.micro_batch;
      smaller->accumulate = a.step.accumulate;
      if (smaller->fits) break;
    }
    if (smaller) out.push_back(*smaller);
    std::vector<int> counts;
    for (int n = 2; n <= 65536; n *= 2) counts.push_back(n);  // as far as the "keeps paying" search
    for (int n : o.replicas)
      if (n >= 2) counts.push_back(n);
    std::sort(counts.begin(), counts.end());
    counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
    // Every count with every micro-batch: each stage keeps the cheapest per
    // useful sample that fits (at equal cost, the fewer replicas and the larger
    // micro-batch, met first), or while none fits, the one that needs the
    // least memory.
    std::vector<Alternative> picks;  // ZeRO-1, -2, -3, in alternatives_at's order
    std::vector<std::int64_t> pick_split;
    for (int n : counts) {
      for (const std::int64_t m : splits) {
        std::size_t k = 0;
        for (const Alternative& a : alternatives_at(profile, split(m), n)) {
          if (!a.name.starts_with("ZeRO")) continue;
          const bool better =
              k == picks.size() ||
              (a.fits ? !picks[k].fits ||
                            a.cost_per_million_useful_samples < picks[k].cost_per_million_useful_samples
                      : !picks[k].fits && a.memory_bytes_per_device < picks[k].memory_bytes_per_device);
          if (k == picks.size()) {
            picks.push_back(a);
            pick_split.push_back(m);
          } else if (better) {
            picks[k] = a;
            pick_split[k] = m;
          }
          ++k;
        }
      }
    }
    // A stage that fits nowhere is listed only when no stage fits, and then
    // only the one that needs the least (the least any option needs).
    const bool any_fits = std::any_of(picks.begin(), picks.end(), [](const Alternative& a) { return a.fits; });
    std::size_t least = 0;
    for (std::size_t k = 1; k < picks.size(); ++k)
      if (picks[k].memory_bytes_per_device < picks[least].memory_bytes_per_device) least = k;
    for (std::size_t k = 0; k < picks.size(); ++k) {
      Alternative& a = picks[k];
      if (!a.fits && (any_fits || k != least)) continue;
      a.name += " at " + std::to_string(a.replicas) + " replicas";
      if (pick_split[k] > 1) {
        a.name += " with " + split_name(pick_split[k]);
        a.micro_batch = mb / pick_split[k];
        a.accumulate = o.step.accumulate * pick_split[k];
      }
      out.push_back(a);
    }
    for (const Alternative& a : alternatives_at(profile, o, r.replicas))
      if (a.outline) out.push_back(a);
  }
  if (max_replicas > 0 && max_replicas < r.replicas) {
    const PlanRow stop = plan_row(profile, o, max_replicas);
    out.push_back(as_alternative(
        stop, "stop at " + std::to_string(max_replicas) + (max_replicas == 1 ? " replica" : " replicas"),
        "the largest listed count that still pays"));
  } else if (max_replicas == 0 && r.replicas > 1) {
    // No listed count pays: fewer replicas than listed may (halving from the
    // smallest listed count down to one, which always pays when it fits).
    for (int n = r.replicas / 2; n >= 1; n /= 2) {
      const PlanRow fewer = plan_row(profile, o, n);
      if (!pays(fewer, o)) continue;
      out.push_back(as_alternative(fewer, "use " + std::to_string(n) + (n == 1 ? " replica" : " replicas"),
                                   "fewer than listed: the largest count, halving from " +
                                       std::to_string(r.replicas) + ", that pays"));
      break;
    }
  }
  // Those that fit and pay first, cheapest useful sample first; outlines last.
  auto rank = [&](const Alternative& a) {
    return std::tuple(a.outline, !a.fits, a.efficiency < efficiency_floor(o) * (1 - 1e-12),
                      a.cost_per_million_useful_samples,
                      -a.efficiency);  // at equal cost, the more efficient first
  };
  std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  return out;
}

// After a remedy that changes the step (smaller micro-batches, accumulated):
// how far data parallelism pays with it, over the listed counts.
std::string with_remedy_text(const Profile& profile, const PlanOptions& o, const Alternative& remedy) {
  PlanOptions a = o;
  a.step.micro_batch = remedy.micro_batch;
  a.step.accumulate = remedy.accumulate;
  int max_ok = 0;
  for (const int n : o.replicas) {
    const PlanRow row = plan_row(profile, a, n);
    if (!pays(row, a)) {
      if (max_ok == 0)
        return strf(" Even with %s, data parallelism does not pay at %d replicas: %s", remedy.name.c_str(),
                    row.replicas, why_text(profile, a, row).c_str());
      const double floor = efficiency_floor(a);
      if (max_ok == 1)
        return strf(" With %s, only one replica still pays. At %d replicas the efficiency falls to %.2f, under "
                    "%.2f; %s",
                    remedy.name.c_str(), row.replicas, row.efficiency, floor, why_text(profile, a, row).c_str());
      const PlanRow ok = plan_row(profile, a, max_ok);
      return strf(
          " With %s, data parallelism pays up to %d replicas (efficiency %.2f). At %d the efficiency falls to %.2f, "
          "under %.2f; %s",
          remedy.name.c_str(), max_ok, ok.efficiency, row.replicas, row.efficiency, floor,
          why_text(profile, a, row).c_str());
    }
    max_ok = n;
  }
  const PlanRow last = plan_row(profile, a, max_ok);
  return strf(" With %s, data parallelism pays at every listed count, up to %d replicas (efficiency %.2f).",
              remedy.name.c_str(), max_ok, last.efficiency);
}

}  // namespace

Recommendation advise(const Profile& profile, const PlanOptions& o, const std::vector<PlanRow>& rows) {
  Recommendation rec;
  const PlanRow* failing = nullptr;
  for (const PlanRow& r : rows) {
    if (!pays(r, o)) {
      failing = &r;
      break;
    }
    rec.max_replicas = r.replicas;
  }
  if (failing == nullptr) {
    // Every listed count pays: look further out, doubling, for where it stops.
    const PlanRow& last = rows.back();
    int beyond = 0;
    PlanRow far;
    for (long n = 2L * last.replicas; n <= 65536 && beyond == 0; n *= 2) {
      far = plan_row(profile, o, static_cast<int>(n));
      if (!pays(far, o)) beyond = static_cast<int>(n);
    }
    rec.summary = strf(
        "Data parallelism pays at every listed count, up to %d replicas (efficiency %.2f, %.3g %s).",
        last.replicas, last.efficiency, last.cost_per_million_useful_samples, per_million(o.critical_batch > 0));
    if (beyond > 0)
      rec.summary += strf(" By this model it stops paying at about %d replicas: %s", beyond,
                          why_text(profile, o, far).c_str());
    else
      rec.summary += " By this model it keeps paying to at least 65536 replicas (the limit of its search).";
    if (o.critical_batch <= 0)
      rec.summary +=
          " This counts systems cost only: give --critical-batch to add the statistical ceiling, past which "
          "more "
          "replicas buy fewer useful samples.";
    return rec;
  }
  rec.first_failing = failing->replicas;
  rec.why = failing->bound;
  rec.why_text = why_text(profile, o, *failing);
  rec.ranked = remedies(profile, o, *failing, rec.max_replicas);
  const Alternative* best = rec.ranked.empty() ? nullptr : &rec.ranked.front();
  const auto replicas_text = [](int n) { return std::to_string(n) + (n == 1 ? " replica" : " replicas"); };
  std::string instead;
  if (best != nullptr) {
    instead = best->outline
                  ? strf(" Instead: %s (%s).", best->name.c_str(), best->detail.c_str())
                  : strf(
                        " First of the remedies (those that pay first, then by cost per useful sample)%s: %s "
                        "(efficiency %.2f, %.3g %s, %s samples/s).",
                        best->replicas == failing->replicas ? (" at " + replicas_text(failing->replicas)).c_str()
                                                            : "",
                        best->name.c_str(), best->efficiency,
                        best->cost_per_million_useful_samples, per_million(o.critical_batch > 0), rate_text(best->samples_per_s).c_str());
    if (!best->fits) {  // then none is the cheapest of anything: say what the least need is
      const Alternative* least = &rec.ranked.front();
      for (const Alternative& a : rec.ranked)
        if (a.memory_bytes_per_device > 0 && a.memory_bytes_per_device < least->memory_bytes_per_device) least = &a;
      instead = strf(
          " No option listed here fits in the device's memory, ZeRO with smaller micro-batches included: the "
          "least any needs is %s (%s), against %s. It needs a device with more memory.",
          bytes_text(least->memory_bytes_per_device).c_str(), least->name.c_str(),
          memory_text(o.device.memory_bytes).c_str());
    }
    if (best->fits && !best->outline && best->micro_batch > 0 && best->name.starts_with("--micro-batch"))
      instead += with_remedy_text(profile, o, *best);
    const bool bigger_batch = best->fits && (best->name.starts_with("raise --micro-batch") ||
                                             best->name.starts_with("--accumulate") ||
                                             best->replicas > failing->replicas);
    if (bigger_batch && o.critical_batch <= 0)
      instead +=
          " A bigger global batch can need more steps to train to the same loss; this counts systems cost "
          "only (give --critical-batch for the statistical ceiling).";
  }
  if (rec.max_replicas == 0) {
    rec.summary = strf("Data parallelism does not pay at any listed count; at %s, the smallest: %s",
                       replicas_text(failing->replicas).c_str(), rec.why_text.c_str()) +
                  instead;
    return rec;
  }
  // "falls to 0.72, under 0.80": the binding threshold (the efficiency
  // floor, or the cost increase as an efficiency), with digits enough to differ.
  const double floor = efficiency_floor(o);
  const bool close = strf("%.2f", failing->efficiency) == strf("%.2f", floor);
  // Named when the cost threshold binds, not --min-efficiency (a user who
  // lowered --min-efficiency read "under 0.80" with no cause).
  const std::string by_cost =
      floor > o.min_efficiency ? strf(" (a cost per sample %.0f%% over one replica's, --max-cost-increase %.2f)",
                                      100 * o.max_cost_increase, o.max_cost_increase)
                               : std::string();
  const std::string falls = (close ? strf("falls to %.4f, under %.4f", failing->efficiency, floor)
                                   : strf("falls to %.2f, under %.2f", failing->efficiency, floor)) +
                            by_cost;
  const PlanRow& ok = *std::find_if(rows.begin(), rows.end(),
                                    [&](const PlanRow& r) { return r.replicas == rec.max_replicas; });
  if (rec.max_replicas == 1) {
    rec.summary =
        strf(
            "Only one replica pays as planned (%.3g %s). At %d replicas the "
            "efficiency %s: %s",
            ok.cost_per_million_useful_samples, per_million(o.critical_batch > 0), failing->replicas,
            falls.c_str(), rec.why_text.c_str()) +
        instead;
    return rec;
  }
  rec.summary = strf(
                    "Use up to %d replicas (efficiency %.2f, %.3g %s). At %d the efficiency "
                    "%s: %s",
                    ok.replicas, ok.efficiency, ok.cost_per_million_useful_samples,
                    per_million(o.critical_batch > 0), failing->replicas,
                    falls.c_str(), rec.why_text.c_str()) +
                instead;
  return rec;
}

}  // namespace lockstep::cost::detail
