// The plan as JSON (lockstep/cost/render.h; fields in docs/cost-model.md).
#include <nlohmann/json.hpp>

#include "lockstep/cost/render.h"

namespace lockstep::cost {
namespace {

using nlohmann::json;

json alternative_json(const Alternative& a) {
  json j = {{"name", a.name},         {"detail", a.detail},
            {"replicas", a.replicas}, {"memory_bytes_per_device", a.memory_bytes_per_device},
            {"fits", a.fits},         {"outline", a.outline}};
  if (!a.outline) {
    j["step_ms"] = a.step_ms;
    j["efficiency"] = a.efficiency;
    j["samples_per_s"] = a.samples_per_s;
    j["cost_per_million_useful_samples"] = a.cost_per_million_useful_samples;
    j["comm_bytes_per_step"] = a.comm_bytes_per_step;
  } else if (a.efficiency > 0) {
    j["efficiency"] = a.efficiency;
  }
  if (a.micro_batch > 0) {
    j["micro_batch"] = a.micro_batch;
    j["accumulate"] = a.accumulate;
  }
  return j;
}

}  // namespace

std::string plan_json(const Plan& plan) {
  const PlanOptions& o = plan.options;
  const StepOptions& s = o.step;
  json rows = json::array();
  for (const PlanRow& r : plan.rows) {
    rows.push_back({{"replicas", r.replicas},
                    {"step_ms", r.step.step_ms},
                    {"compute_ms", r.step.compute_ms},
                    {"comm_ms", r.step.comm_ms},
                    {"exposed_comm_ms", r.step.exposed_comm_ms},
                    {"alpha_ms", r.step.alpha_ms},
                    {"beta_ms", r.step.beta_ms},
                    {"gamma_ms", r.step.gamma_ms},
                    {"negotiation_ms", r.step.negotiation_ms},
                    {"straggler_ms", r.step.straggler_ms},
                    {"algorithm", to_string(r.step.algorithm)},
                    {"buckets", r.step.buckets.size()},
                    {"gradient_bytes", r.step.gradient_bytes},
                    {"bytes_sent_per_step", r.step.bytes_sent},
                    {"systems_efficiency", r.systems_efficiency},
                    {"statistical_efficiency", r.statistical_efficiency},
                    {"efficiency", r.efficiency},
                    {"samples_per_s", r.samples_per_s},
                    {"cost_per_million_samples", r.cost_per_million_samples},
                    {"cost_per_million_useful_samples", r.cost_per_million_useful_samples},
                    {"memory_bytes_per_device", r.memory.total()},
                    {"memory",
                     {{"weights", r.memory.weights},
                      {"gradients", r.memory.gradients},
                      {"optimizer_state", r.memory.optimizer_state},
                      {"activations", r.memory.activations}}},
                    {"fits", r.fits},
                    {"limited_by", to_string(r.bound)}});
  }
  json alternatives = json::array();
  for (const Alternative& a : plan.alternatives) alternatives.push_back(alternative_json(a));
  json ranked = json::array();
  for (const Alternative& a : plan.recommendation.ranked) ranked.push_back(alternative_json(a));
  const Recommendation& rec = plan.recommendation;
  const json j = {{"model", plan.model},
                  {"inputs",
                   {{"gradient_bytes", plan.profile.param_bytes()},
                    {"replicas", o.replicas},
                    {"step_compute_ms", plan.profile.step_compute_ms},
                    {"profile_micro_batch", plan.profile.micro_batch},
                    {"micro_batch", s.micro_batch},
                    {"accumulate", s.accumulate},
                    {"algorithm", to_string(s.algorithm)},
                    {"first_bucket_mb", s.first_bucket_mb},
                    {"bucket_mb", s.bucket_mb},
                    {"launch", s.launch == StepOptions::Launch::PerLayer ? "layers"
                               : s.launch == StepOptions::Launch::Cycles ? "cycles"
                                                                         : "buckets"},
                    {"cycle_ms", s.cycle_ms},
                    {"compress", s.bf16 ? "bf16" : "none"},
                    {"zero", s.zero1 ? 1 : 0},
                    {"compute_cv", s.compute_cv},
                    {"host_cores", s.host_cores},
                    {"host_latency_us", s.host_latency_s * 1e6},
                    {"per_node", s.topology.per_node},
                    {"link_bytes_per_second", s.topology.inter.bytes_per_second},
                    {"link_latency_us", s.topology.inter.latency_s * 1e6},
                    {"intra_bytes_per_second", s.topology.intra.bytes_per_second},
                    {"intra_latency_us", s.topology.intra.latency_s * 1e6},
                    {"device", o.device.name},
                    {"device_flops", o.device.flops},
                    {"device_memory_bytes", o.device.memory_bytes},
                    {"optimizer", to_string(o.optimizer)},
                    {"price_per_device_hour", o.price_per_device_hour},
                    {"critical_batch", o.critical_batch},
                    {"min_efficiency", o.min_efficiency},
                    {"max_cost_increase", o.max_cost_increase}}},
                  {"rows", rows},
                  {"alternatives", alternatives},
                  {"recommendation",
                   {{"max_replicas", rec.max_replicas},
                    {"first_failing", rec.first_failing},
                    {"limited_by", to_string(rec.why)},
                    {"why", rec.why_text},
                    {"ranked", ranked},
                    {"summary", rec.summary}}}};
  return j.dump(2) + "\n";
}

}  // namespace lockstep::cost
