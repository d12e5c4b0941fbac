// Private: one replica's training loop, run on its own thread.
#pragma once

#include "lockstep/comm/communicator.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train::detail {

struct Shared {  // read-only during training; owned by train()
  const TrainConfig& config;
  const data::ImageClassificationData& data;
  const TrainHooks& hooks;
  const ddp::DistributedSampler& sampler;
  std::int64_t total_steps;
  std::int64_t warmup_steps;  // < total_steps; 0 if the config asked for too many
};

struct ReplicaOutput {
  TrafficBytes traffic;
  double final_loss = 0;
  std::vector<double> epoch_test_accuracy;
  double train_seconds = 0;
  std::int64_t epochs_run = 0;
  std::vector<float> params;  // filled on rank 0 only
};

ReplicaOutput run_replica(const Shared& shared, comm::Communicator& comm);

}  // namespace lockstep::train::detail
