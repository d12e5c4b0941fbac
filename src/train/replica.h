// Private: one replica's training loop, run on its own thread.
#pragma once

#include <chrono>
#include <limits>
#include <utility>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train::detail {

struct Shared {  // read-only during training; owned by train()
  // The run's config, whose starting state (initial_params, ...) the
  // replicas read from here; and the same less that state, which each
  // replica copies (without_starting_state: N copies of a checkpoint's
  // state would be N times its memory).
  const TrainConfig& config;
  const TrainConfig& settings;
  const data::ImageClassificationData& data;
  const TrainHooks& hooks;
  const ddp::DistributedSampler& sampler;
  std::int64_t total_steps;
  std::int64_t warmup_steps;                 // < total_steps; 0 if the config asked for too many
  std::chrono::steady_clock::time_point t0;  // the timeline's zero, the same for all replicas
  // Over a process group, rank 0's config.record_timeline decides for every
  // rank (it alone writes the trace), broadcast after the handshake.
  bool timeline_from_rank0 = false;
  // The training inputs' digest for the handshake, taken once per process
  // (in-process replicas share the data: ~30 ms for Fashion-MNIST each).
  std::uint64_t inputs_digest = 0;
};

// Whether each replica keeps batch-norm statistics of its own (--bn-stats
// local on a model with buffers, more than one replica; --deterministic
// sums their updates in its tree): what a checkpoint holds replica by replica.
bool replicas_keep_own_buffers(const TrainConfig& config, const nn::Model& model);

// Empty if `replica_buffers` and `error_feedback` floats are the per-replica
// parts a run of `config` resumes from (one for each replica of what it
// keeps, none of what it does not); otherwise what is wrong, for a message:
// "'error_feedback.<r>.*' rounding errors for 1 replicas, but a run with
// --compress bf16 and 2 replicas keeps them for each".
std::string replica_parts_mismatch(const TrainConfig& config, const nn::Model& model, std::size_t replica_buffers,
                                   std::size_t error_feedback);

// `config` without initial_params, initial_buffers, initial_optimizer_state
// and the per-replica parts (start_step and initial_optimizer_steps stay).
TrainConfig without_starting_state(const TrainConfig& config);

struct StepSample {  // one step of one replica, in ms
  double step = 0, compute = 0, comm = 0, exposed = 0;
  double check = 0;  // the divergence check, if this step ran it (inside `step`)
  // Start and end of each of the step's gradient all-reduces, in launch
  // order; and the part of `comm` spent waiting for the last replica to join
  // them (attribute_waits; NaN until it runs).
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>> spans;
  double comm_wait = std::numeric_limits<double>::quiet_NaN();
};

struct ReplicaOutput {
  TrafficBytes traffic;
  double final_loss = 0;
  std::int64_t final_loss_first_step = 0;  // the window's first step (0-based)
  bool final_loss_window_cut = false;      // TrainResult::final_loss_window_cut
  std::vector<double> epoch_test_accuracy;
  double train_seconds = 0;
  std::int64_t epochs_run = 0;
  std::int64_t steps_run = 0;   // the total, unless stopped early (TrainHooks::stop_requested)
  bool stopped_early = false;
  std::vector<float> params;   // this replica's final weights
  std::vector<float> buffers;  // and buffers (batch norm running statistics)
  std::vector<ddp::Bucket> buckets;
  bool overlapped = false;
  std::vector<StepSample> steps;
  bool recorded_timeline = false;      // config.record_timeline, or rank 0's (Shared::timeline_from_rank0)
  std::vector<TimelineEvent> events;  // if recorded_timeline
  std::size_t handshake_fields = 0;
  std::int64_t divergence_checks = 0, repairs = 0, accounting_checks = 0, buffer_checks_differing = 0;
  std::vector<TrainResult::Skip> skipped;
  std::vector<double> grad_norms;  // --clip-grad-norm: each applied step's norm before clipping
  std::int64_t clipped_steps = 0;
};

// Medians of the samples' fields (overlap from each step's own ratio).
StepTimes median_times(std::span<const StepSample> samples);

// Sets every sample's comm_wait from all replicas' spans of the same step and
// all-reduce: the time from a replica's start to the last replica's start,
// at most the replica's own span (Note [Waiting for the last replica]). Needs
// every replica's output, on one clock; leaves the samples untouched if the
// replicas' steps or spans do not line up.
void attribute_waits(std::span<ReplicaOutput> outputs);

ReplicaOutput run_replica(const Shared& shared, comm::Communicator& comm);

}  // namespace lockstep::train::detail
