// Private: collectives of a few tallies, and the test accuracy built on them
// (evaluate.cpp).
#pragma once

#include <span>

#include "lockstep/comm/communicator.h"
#include "lockstep/data/dataset.h"
#include "lockstep/nn/model.h"

namespace lockstep::train::detail {

// Sums `values` over the replicas, in place (exact for counts below 2^24).
void allreduce_tallies(comm::Communicator& comm, std::span<double> values);

// The test accuracy of `model`, the same on every replica: a collective.
// Leaves the model in training mode.
double evaluate(comm::Communicator& comm, nn::Model& model, const data::Dataset& test);

}  // namespace lockstep::train::detail
