// Private: the checks train() and train_replica() make of a config and its
// data before anything runs (validate_config.cpp).
#pragma once

#include "lockstep/train/trainer.h"

namespace lockstep::train::detail {

// Throws InvalidArgument naming the flag (or the data set) that is out of
// range, unknown, or does not go with the others or with the data.
void validate(const TrainConfig& c, const data::ImageClassificationData& data);

}  // namespace lockstep::train::detail
