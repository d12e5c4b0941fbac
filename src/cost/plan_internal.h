// Shared between plan.cpp and advisor.cpp.
#pragma once

#include <vector>

#include "lockstep/cost/plan.h"

namespace lockstep::cost::detail {

// The ways to run `replicas` other than plain data parallelism, and plain
// data parallelism first (name "data parallel", or "data parallel, ZeRO-1" under --zero 1).
std::vector<Alternative> alternatives_at(const Profile& profile, const PlanOptions& options, int replicas);
// A row as an Alternative.
Alternative as_alternative(const PlanRow& row, std::string name, std::string detail);
// The efficiency a count must reach to pay: the higher of --min-efficiency
// and the cost threshold as an efficiency, 1 / (1 + max_cost_increase).
double efficiency_floor(const PlanOptions& options);
// True when a row fits and meets efficiency_floor.
bool pays(const PlanRow& row, const PlanOptions& options);
Recommendation advise(const Profile& profile, const PlanOptions& options, const std::vector<PlanRow>& rows);

}  // namespace lockstep::cost::detail
