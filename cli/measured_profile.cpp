#include "measured_profile.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "median.h"
#include "train_memory.h"

namespace lockstep::cli {

// Per-layer forward and backward times of this run (medians over every
// replica and step but the run's first), for `lockstep plan --profile`.
cost::Profile measured_profile(const train::TrainConfig& c, const train::TrainResult& r,
                               const data::ImageClassificationData& data) {
  std::map<int, std::vector<double>> forward, backward;
  std::vector<double> optimizer;
  // --deterministic computes a step's micro-batches atom by atom: its events
  // are summed per replica, step and layer, and divided by --accumulate, so
  // that each time is one micro-batch's.
  std::map<std::tuple<int, std::int64_t, int, bool>, double> per_micro_batch;
  for (const auto& e : r.timeline) {
    // The run's first step warms up (a resumed run's too): left out.
    const bool first = e.step == r.resumed_from_step;
    if (!first && e.phase == train::Phase::Optimizer) optimizer.push_back((e.end_us - e.start_us) / 1000);
    if (e.layer < 0 || first) continue;
    const bool fwd = e.phase == train::Phase::Forward;
    const double ms = (e.end_us - e.start_us) / 1000;
    if (c.deterministic)
      per_micro_batch[{e.replica, e.step, e.layer, fwd}] += ms;
    else
      (fwd ? forward : backward)[e.layer].push_back(ms);
  }
  for (const auto& [key, ms] : per_micro_batch)
    (std::get<3>(key) ? forward : backward)[std::get<2>(key)].push_back(ms / double(c.accumulate));
  cost::Profile p;
  p.model = r.model_description;
  p.replicas = int(r.replicas);
  p.micro_batch = r.micro_batch;
  // One micro-batch's step: with --accumulate K the step computed K of them
  // and stepped the optimizer once.
  const double optimizer_ms = optimizer.empty() ? 0 : median(optimizer);
  p.step_compute_ms = (r.times.compute_ms - optimizer_ms) / double(c.accumulate) + optimizer_ms;
  p.activation_bytes_per_sample = model_size(c, data).activation_floats * sizeof(float);
  const int layers = forward.empty() ? 0 : forward.rbegin()->first + 1;
  for (int i = 0; i < layers; ++i) {
    cost::LayerCost l{std::to_string(i), 0, median(forward[i]), median(backward[i])};
    const std::string prefix = std::to_string(i) + ".";
    for (const auto& t : r.layout.tensors())
      if (t.name.rfind(prefix, 0) == 0) l.param_bytes += double(t.numel * sizeof(float));
    p.layers.push_back(l);
  }
  return p;
}

}  // namespace lockstep::cli
