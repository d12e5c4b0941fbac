// A training run's per-layer times, for `lockstep plan --profile`
// (measured_profile.cpp).
#pragma once

#include "lockstep/cost/profile.h"
#include "lockstep/data/dataset.h"
#include "lockstep/train/trainer.h"

namespace lockstep::cli {

// The profile of the run that gave `r` (which recorded its timeline).
cost::Profile measured_profile(const train::TrainConfig& c, const train::TrainResult& r,
                               const data::ImageClassificationData& data);

}  // namespace lockstep::cli
