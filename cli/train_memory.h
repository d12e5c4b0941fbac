// The memory a training run takes: the model's size, and the check of it
// against what the host has free (check_memory, commands.h; train_memory.cpp).
#pragma once

#include "lockstep/data/dataset.h"
#include "lockstep/train/trainer.h"

namespace lockstep::cli {

struct ModelSize {
  double params = 0;
  double activation_floats = 0;  // per sample
};

// The model's parameters and activations per sample, without building a
// large one.
ModelSize model_size(const train::TrainConfig& c, const data::ImageClassificationData& data);

}  // namespace lockstep::cli
