// Private: a run's TrainResult, from the outputs of its replicas
// (assemble_result.cpp).
#pragma once

#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/train/trainer.h"
#include "replica.h"
#include "run_plan.h"

namespace lockstep::train::detail {

// `outputs`: the replicas this process ran, all of them or (over a process
// group) its one; their params and events are moved into the result.
TrainResult assemble(const TrainConfig& c, const Plan& p, std::vector<ReplicaOutput>& outputs);

// Every rank's traffic: a collective over the process group.
std::vector<TrafficBytes> gather_traffic(comm::Communicator& comm, const TrafficBytes& mine);

}  // namespace lockstep::train::detail
