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
  const TrainConfig& config;
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
