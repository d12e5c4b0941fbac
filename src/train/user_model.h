// Private: what the trainer checks of TrainConfig::model and model_factory,
// and how it calls a factory (user_model.cpp).
#pragma once

#include <string>

#include "lockstep/nn/model.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train::detail {

// Throws InvalidArgument unless config.model names a built-in model (no
// factory) or, with config.model_factory, a model of the user's own.
void check_model_name(const TrainConfig& config);

// How `model` differs from `first` in its layers, parameters or buffers, for
// a message ("parameter 2 is ... here and ... in the first"); "" if it does not.
std::string model_difference(const nn::Model& model, const nn::Model& first);

// config.model_factory, called one call at a time by whichever thread calls
// it; each model it builds is checked against `first` (the run's probe, its
// first call), which must outlive it: Note [A model of the user's own].
ModelFactory one_call_at_a_time(const TrainConfig& config, const nn::Model& first);

}  // namespace lockstep::train::detail
