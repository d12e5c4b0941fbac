// Shared between plan.cpp and advisor.cpp.
#pragma once

#include <vector>

#include "lockstep/cost/plan.h"

namespace lockstep::cost::detail {

// The ways to run `replicas` other than plain data parallelism, and plain
// data parallelism first (name "data parallel").
std::vector<Alternative> alternatives_at(const Profile& profile, const PlanOptions& options, int replicas);
// A row as an Alternative.
Alternative as_alternative(const PlanRow& row, std::string name, std::string detail);
// True when a row meets both the efficiency and the cost threshold.
bool pays(const PlanRow& row, const PlanOptions& options);
Recommendation advise(const Profile& profile, const PlanOptions& options, const std::vector<PlanRow>& rows);

}  // namespace lockstep::cost::detail
