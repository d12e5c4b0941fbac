// The plan, three ways: a table for people, JSON for programs, and an SVG
// plot of efficiency and cost per sample against replica count (hand-written,
// no library, like the trainer's timeline).
#pragma once

#include <string>

#include "lockstep/cost/plan.h"

namespace lockstep::cost {

std::string plan_table(const Plan& plan);
// {"model", "inputs", "rows": [{replicas, step_ms, compute_ms, comm_ms,
// exposed_comm_ms, efficiency, samples_per_s, cost_per_million_samples,
// memory_bytes_per_device, ...}], "alternatives", "recommendation"}
std::string plan_json(const Plan& plan);
std::string plan_svg(const Plan& plan);

}  // namespace lockstep::cost
