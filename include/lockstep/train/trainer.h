// The trainer: N replicas in lockstep, wired from the pieces of the data path.
//
//   data (shared, read-only) -> sampler shard -> model forward/backward (local)
//     -> average_gradients (the one all-reduce) -> optimizer step (identical)
//
// Weights are initialised once on rank 0 (or loaded) and broadcast; after
// that only gradients cross between replicas, and the bytes every replica
// sent are counted by the communicator and split by purpose in the result.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/comm/collectives.h"
#include "lockstep/data/dataset.h"
#include "lockstep/ddp/sampler.h"
#include "lockstep/nn/arena.h"
#include "lockstep/nn/model.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::train {

struct TrainConfig {
  int replicas = 8;
  std::int64_t micro_batch = 32;
  std::int64_t epochs = 10;
  std::int64_t steps = 0;  // > 0: stop after this many steps instead of `epochs`
  std::string model = "mlp";
  std::vector<std::int64_t> hidden = {512, 512};
  std::string optimizer = "sgd";  // sgd | adamw
  float lr = 0.1f;
  optim::Schedule schedule = optim::Schedule::Cosine;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  std::uint64_t seed = 0;
  bool shuffle = true;
  ddp::LastBatch last_batch = ddp::LastBatch::Drop;
  comm::Algorithm algorithm = comm::Algorithm::Auto;
  comm::Duration timeout{std::chrono::seconds(60)};
  bool evaluate = true;                              // test accuracy after every epoch
  std::int64_t log_every = 50;                       // progress every this many steps
  std::optional<std::vector<float>> initial_params;  // replaces init (e.g. --init FILE)
  double peak_flops = 0;                             // measured peak for MFU; 0 = no MFU
  std::int64_t warmup_steps = 0;                     // steps left out of the throughput timing
};

struct Progress {
  std::int64_t epoch = 0;  // 0-based
  std::int64_t step = 0;   // steps completed
  std::int64_t total_steps = 0;
  double loss = 0;           // mean training loss since the last report
  double samples_per_s = 0;  // since the start of training
  float lr = 0;
  std::optional<double> test_accuracy;  // set at the end of an epoch
};

struct TrafficBytes {  // bytes one replica sent, measured at the communicator
  std::uint64_t init_broadcast = 0;
  std::uint64_t gradients = 0;    // all steps together
  std::uint64_t control = 0;      // loss and accuracy tallies
  std::uint64_t unaccounted = 0;  // anything else (must be 0)
};

struct TrainResult {
  std::int64_t replicas = 0, micro_batch = 0, global_batch = 0, steps = 0, epochs_run = 0;
  std::int64_t samples_seen = 0;
  double final_loss = 0;
  std::optional<double> test_accuracy;
  std::vector<double> epoch_test_accuracy;
  double train_seconds = 0;  // step loop only, without evaluation
  double samples_per_s = 0;
  double flops_per_sample = 0;
  double mfu = 0;  // 0 if no peak was given
  std::uint64_t param_count = 0;
  std::uint64_t weight_bytes = 0, grad_bytes = 0, optimizer_state_bytes = 0;
  std::uint64_t allreduce_bytes_per_step_formula = 0;  // 2P(N-1)/N
  std::vector<TrafficBytes> traffic;                   // per replica
  std::string model_description, optimizer_description;
  nn::Layout layout;
  std::vector<float> params;  // replica 0's final weights
};

struct TrainHooks {
  // Called on rank 0's thread every log_every steps and at each epoch end.
  std::function<void(const Progress&)> on_progress;
  // Called on every replica's thread after each optimizer step (tests).
  std::function<void(int rank, std::int64_t step, std::span<const float> params,
                     std::span<const float> optimizer_state)>
      on_replica_step;
};

// Builds the model that TrainConfig describes (every replica calls this).
std::unique_ptr<nn::Model> make_model(const TrainConfig& config, std::int64_t features, std::int64_t classes);

// Builds the optimizer that TrainConfig describes for `numel` parameters.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& config, std::size_t numel);

// Runs training. Throws InvalidArgument for a config that cannot work, and
// rethrows the first replica's error if one fails (the others are stopped).
TrainResult train(const TrainConfig& config, const data::ImageClassificationData& data,
                  const TrainHooks& hooks = {});

}  // namespace lockstep::train
