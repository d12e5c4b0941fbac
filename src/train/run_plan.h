// Private: what a run derives from its config before any replica starts,
// and the checks that need it (run_plan.cpp).
#pragma once

#include <cstdint>
#include <memory>

#include "lockstep/ddp/sampler.h"
#include "lockstep/nn/model.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train::detail {

// What train() and train_replica() both derive from the config before any
// replica starts.
struct Plan {
  ddp::DistributedSampler sampler;
  std::int64_t total_steps = 0;
  std::int64_t warmup = 0;
  std::unique_ptr<nn::Model> probe;  // describes the model; never trained
};

// Validates the config against the data and plans the run; throws
// InvalidArgument naming the flag, as train() does.
Plan plan(const TrainConfig& c, const data::ImageClassificationData& data);

// Throws InvalidArgument unless a resumed run's per-replica parts fit the
// config (checked where `root`: this process holds rank 0).
void check_checkpointing(const TrainConfig& c, const nn::Model& probe, bool root);

}  // namespace lockstep::train::detail
