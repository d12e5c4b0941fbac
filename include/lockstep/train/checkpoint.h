// Checkpoints: what a run needs to go on from where it stopped, in one
// safetensors file (lockstep train --checkpoint FILE, --resume FILE).
//
// Tensors: the weights and buffers under their PyTorch names (as --save
// writes them), then every optimizer slot of every parameter as
// "optimizer.<slot>.<name>" (e.g. "optimizer.momentum_buffer.0.weight"; under
// --zero 1 gathered from the replicas' shards). State that differs by
// replica, for each replica r: its buffers as "replica.<r>.<name>"
// (--bn-stats local) and its bf16 rounding error as
// "error_feedback.<r>.<name>" (--compress bf16).
// Metadata: "format" = "lockstep-checkpoint", "version" = "1", the steps done
// and planned, the optimizer's updates, the last steps skipped in a row
// ("skips_in_a_row", for --max-skips; absent from files written before it,
// read as 0), and "trajectory", a JSON object of trajectory_fields(): the
// settings a resumed run must share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/train/trainer.h"

namespace lockstep::train {

// Whether `path` is a safetensors file whose metadata says it is a
// checkpoint (reads the header only; false for anything else, unreadable too,
// and for anything but a regular file, which it does not open).
bool is_checkpoint(const std::filesystem::path& path);

// Writes `checkpoint` atomically (the file is replaced whole or not at all).
// `fields`: trajectory_fields() of the run. Throws IoError naming the path.
void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint,
                     const std::vector<std::pair<std::string, std::string>>& fields, const std::string& model);

// Writes checkpoints on a thread of its own (Note [Checkpoints in the
// background]): write() copies what the checkpoint's spans point at and
// returns, and the file is written, fsync'ed and renamed into place while the
// replicas train on. One write at a time: write() first waits for the one
// before, and throws its IoError. finish() waits for the last and throws its
// error; the destructor waits too (a run that fails still leaves its last
// checkpoint whole) but cannot report, so call finish() when the run ends.
class CheckpointWriter {
 public:
  CheckpointWriter(std::filesystem::path path, std::vector<std::pair<std::string, std::string>> fields,
                   std::string model);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void write(const Checkpoint& checkpoint);
  void finish();

 private:
  struct Staged;
  std::filesystem::path path_;
  std::vector<std::pair<std::string, std::string>> fields_;
  std::string model_;
  std::unique_ptr<Staged> staged_;  // the copy being written: owned here, reused
  std::future<void> writing_;
};

struct LoadedCheckpoint {
  std::int64_t steps_done = 0, steps_planned = 0, optimizer_steps = 0;
  std::int64_t skips_in_a_row = 0;  // 0 in a file written before it was recorded
  std::vector<float> params, buffers, optimizer_state;  // laid out as the model's and the optimizer's arenas
  // Per replica, as TrainConfig::initial_replica_buffers and
  // initial_error_feedback: empty unless the writer kept them.
  std::vector<float> replica_buffers, error_feedback;
  std::vector<std::pair<std::string, std::string>> fields;  // the writer's trajectory_fields()
  std::filesystem::path path;  // the file it was read from, for resume_from's messages
};

// Reads a checkpoint of the model `config` describes. IoError names the file
// and the defect: not a checkpoint (a weights file: use --init), a missing,
// extra or mis-shaped tensor, malformed metadata.
LoadedCheckpoint load_checkpoint(const std::filesystem::path& path, const TrainConfig& config,
                                 const data::ImageClassificationData& data);

// The weights and buffers of a checkpoint alone (--init FILE), whatever the
// optimizer that wrote it: the result's optimizer_state is empty.
LoadedCheckpoint load_checkpoint_weights(const std::filesystem::path& path, const TrainConfig& config,
                                         const data::ImageClassificationData& data);

// Sets config to go on from `checkpoint` (start_step, initial_params,
// initial_buffers, initial_optimizer_state, initial_optimizer_steps,
// initial_skips_in_a_row), after
// checking that this run's trajectory_fields() are the writer's: otherwise
// InvalidArgument names the first that differs, with both values. IoError if
// the state that differs by replica is not there for each of this run's
// replicas (with the same fields, only a damaged file lacks it).
// `transport` as trajectory_fields() takes it. A checkpoint of a run that
// had ended (its last step) is refused with InvalidArgument, unless `ended`
// is Finish: then start_step is the run's last, and train() runs no step
// but evaluates the weights (Note [A job that had ended]).
enum class IfEnded { Refuse, Finish };
void resume_from(TrainConfig& config, const data::ImageClassificationData& data, LoadedCheckpoint checkpoint,
                 const std::string& transport = "threads", IfEnded ended = IfEnded::Refuse);

}  // namespace lockstep::train
