// `lockstep plan`: the cost of data parallelism per replica count, where it
// stops paying, why, and what to do instead, in cost terms.
#pragma once

#include <string>
#include <vector>

#include "lockstep/cost/models.h"
#include "lockstep/cost/step_cost.h"

namespace lockstep::cost {

enum class Optimizer { Sgd, Momentum, AdamW };  // state: 0, 1 or 2 x parameter bytes
double optimizer_state_factor(Optimizer optimizer);
double optimizer_passes(Optimizer optimizer);  // memory passes of one update, in parameter bytes
const char* to_string(Optimizer optimizer);

struct PlanOptions {
  std::vector<int> replicas = {1, 2, 4, 8, 16, 32, 64};
  StepOptions step;  // its `replicas` is set per row
  Device device;     // memory per device
  Optimizer optimizer = Optimizer::Momentum;
  double price_per_device_hour = 1.0;  // any currency
  double critical_batch = 0;           // McCandlish et al. 2018's B_crit; 0 = no statistical ceiling
  // The one-replica batch a sample's statistical worth is measured against:
  // (reference + B_crit) / (N b k + B_crit). 0: this plan's own b x k.
  // make_plan sets it, so that remedies that change b or k (planned from
  // copies of these options) are priced against the same baseline.
  double reference_batch = 0;
  double min_efficiency = 0.8;         // systems x statistical
  double max_cost_increase = 0.25;     // cost per useful sample may rise this much over one replica
};

// What limits a configuration.
enum class Bound { Fine, Latency, Bandwidth, ExposedTail, Stragglers, Statistical, Memory };
const char* to_string(Bound bound);

struct Memory {
  double weights = 0, gradients = 0, optimizer_state = 0, activations = 0;
  double total() const { return weights + gradients + optimizer_state + activations; }
};

struct PlanRow {
  int replicas = 0;
  StepPrediction step;
  double systems_efficiency = 0;      // one replica's step / this step (same micro-batch)
  double statistical_efficiency = 1;  // (b + B_crit) / (N b + B_crit); 1 without --critical-batch
  double efficiency = 0;              // the product
  double samples_per_s = 0;
  double cost_per_million_samples = 0;
  double cost_per_million_useful_samples = 0;  // divided by the statistical efficiency
  Memory memory;
  bool fits = true;
  Bound bound = Bound::Fine;
  // What the step loses against one replica, split in two: waiting for the
  // slowest replica (this step - the same step with compute_cv 0) and
  // communication (the step with compute_cv 0 - one replica's step).
  double straggler_loss_ms = 0, comm_loss_ms = 0;
};

// One way to run (or not run) the target replica count.
struct Alternative {
  std::string name;    // "raise --micro-batch to 128", "ZeRO-1", ...
  std::string detail;  // what changes, one line
  int replicas = 0;
  double step_ms = 0, efficiency = 0, samples_per_s = 0, cost_per_million_useful_samples = 0;
  double memory_bytes_per_device = 0;
  double comm_bytes_per_step = 0;  // per device
  bool fits = true;
  bool outline = false;  // tensor/pipeline parallelism: memory and communication only, no step time
  // The micro-batch and micro-steps per step it runs with, where it changes
  // them (smaller micro-batches when memory is the limit); 0: as planned.
  std::int64_t micro_batch = 0, accumulate = 0;
};

struct Recommendation {
  int max_replicas = 0;             // largest listed count at which data parallelism still pays (0: none)
  int first_failing = 0;            // smallest listed count that does not (0: none)
  Bound why = Bound::Fine;          // at first_failing
  std::string why_text;             // one or two sentences with the numbers
  std::vector<Alternative> ranked;  // remedies at first_failing, cheapest useful sample first
  std::string summary;              // what a user should do, in two or three sentences
};

struct Plan {
  std::string model;
  Profile profile;
  PlanOptions options;
  std::vector<PlanRow> rows;              // in the order of options.replicas
  std::vector<Alternative> alternatives;  // ZeRO-1/2/3, accumulation, bf16, TP, PP at the target count
  Recommendation recommendation;
};

// Throws InvalidArgument for an empty or non-positive replica list, an
// efficiency threshold outside (0, 1], a price that is not positive, negative batches.
PlanRow plan_row(const Profile& profile, const PlanOptions& options, int replicas);
Plan make_plan(const Profile& profile, const PlanOptions& options);

}  // namespace lockstep::cost
