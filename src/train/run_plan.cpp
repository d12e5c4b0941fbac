#include "run_plan.h"

#include <algorithm>
#include <string>

#include "guards.h"
#include "lockstep/error.h"
#include "replica.h"
#include "validate_config.h"

namespace lockstep::train::detail {

Plan plan(const TrainConfig& c, const data::ImageClassificationData& data) {
  validate(c, data);
  std::int64_t per_replica = 0, effective = 0;  // the sampler's message would name neither --accumulate nor B
  if (c.accumulate > 1 && (__builtin_mul_overflow(c.micro_batch, c.accumulate, &per_replica) ||
                           __builtin_mul_overflow(per_replica, std::int64_t{c.replicas}, &effective) ||
                           effective > data.train.size)) {
    throw InvalidArgument("the effective batch (" + std::to_string(c.replicas) + " replicas x " +
                          std::to_string(c.micro_batch) + " x " + std::to_string(c.accumulate) +
                          " accumulated) is larger than the data set (" + std::to_string(data.train.size) +
                          " samples); lower --accumulate, --micro-batch or --replicas.");
  }
  ddp::DistributedSampler sampler({.dataset_size = data.train.size,
                                   .world_size = c.replicas,
                                   .micro_batch = c.micro_batch * c.accumulate,
                                   .shuffle = c.shuffle,
                                   .seed = c.seed,
                                   .last_batch = c.ragged == Ragged::Drop || c.deterministic
                                                     ? ddp::LastBatch::Drop
                                                     : ddp::LastBatch::Keep});
  const std::int64_t total_steps = c.steps > 0 ? c.steps : c.epochs * sampler.steps_per_epoch();
  if (c.lr_warmup > total_steps) {
    throw InvalidArgument("--lr-warmup " + std::to_string(c.lr_warmup) + " is longer than the run (" +
                          std::to_string(total_steps) +
                          " steps), which would end before reaching --lr; give a "
                          "shorter --lr-warmup, or more --steps or --epochs.");
  }
  for (const auto& f : c.inject) {
    // throw@<the run's steps>: a rank that fails after the last step, its
    // checkpoint written, while the outputs are gathered (Note [A job that
    // had ended]).
    const bool after_the_last = f.kind == Fault::Kind::Throw && f.step == total_steps;
    if (f.kind != Fault::Kind::SameSeed && f.step >= total_steps && !after_the_last) {
      throw InvalidArgument("--inject names step " + std::to_string(f.step) + ", past the run's last step (" +
                            std::to_string(total_steps - 1) + "); the fault would never happen.");
    }
    // --zero 1: the next all-gather overwrites a flipped weight with its
    // owner's, or copies it to every replica; only a check in the flip's own
    // step sees it (Zero.AFlippedWeightIsSeenOnlyInItsOwnStep).
    const bool checked_step =
        c.check_every > 0 && ((f.step + 1) % c.check_every == 0 || f.step == total_steps - 1);
    if (f.kind == Fault::Kind::BitFlip && c.zero == 1 && c.replicas > 1 && !checked_step) {
      throw InvalidArgument(
          "--inject bitflip@" + std::to_string(f.step) +
          " under --zero 1 is seen only by a divergence check in that same step: the next "
          "all-gather overwrites the flipped weight with its owner's, or copies it to every "
          "replica, and no comparison sees it then. Flip at a checked step (K-1, 2K-1, ... with "
          "--check-every K, or the last), or leave out --zero 1.");
    }
  }
  auto probe = make_model(c, data.train.features, data.train.num_classes);
  for (const auto& f : c.inject) {  // a fault no guard could see would show nothing
    if (f.kind == Fault::Kind::BufferBitFlip && probe->buffer_layout().tensors().empty()) {
      throw InvalidArgument(
          "--inject bitflip-buffer needs a model with buffers (batch norm: --model cnn); " +
          (c.model_factory ? "model '" + c.model + "' (" + probe->describe() + ")" : "--model " + c.model) +
          " has none.");
    }
  }
  if (c.initial_params && c.initial_params->size() != probe->layout().numel()) {
    throw InvalidArgument("initial weights hold " + std::to_string(c.initial_params->size()) +
                          " values but the model has " + std::to_string(probe->layout().numel()));
  }
  if (c.initial_buffers && c.initial_buffers->size() != probe->buffer_layout().numel()) {
    throw InvalidArgument("initial buffers hold " + std::to_string(c.initial_buffers->size()) +
                          " values but the model has " + std::to_string(probe->buffer_layout().numel()));
  }
  // Training from them would give NaN from step 0, and the run would end
  // after --max-skips steps naming the gradients, not the weights.
  const auto check_finite = [](const char* what, const nn::Layout& layout, const std::vector<float>& all) {
    if (const nn::TensorSpec* t = nn::first_nonfinite_tensor(layout, all)) {
      throw InvalidArgument(std::string(what) + ": tensor " + t->name +
                            " holds NaN or infinite values; no model trains from them. Give finite "
                            "starting values, or leave it empty for the model's own init.");
    }
  };
  if (c.initial_params) check_finite("initial_params", probe->layout(), *c.initial_params);
  if (c.initial_buffers) check_finite("initial_buffers", probe->buffer_layout(), *c.initial_buffers);
  if (c.zero == 1 && c.replicas > 1 && !c.deterministic) {
    // Note [Non-finite sentinel], sharded: every rank's chunk of the last bucket carries the flag.
    const auto buckets = detail::planned_buckets(c, probe->layout());
    if (buckets.back().numel < static_cast<std::size_t>(c.replicas)) {
      throw InvalidArgument(
          "--zero 1 cuts every gradient bucket into one chunk per replica, but the last bucket holds "
          "only " +
          std::to_string(buckets.back().numel) + " values for " + std::to_string(c.replicas) +
          " replicas; use fewer replicas or a larger model.");
    }
  }
  // start_step == total_steps: a run that had ended (Note [A job that had
  // ended]): no step is left, and the run evaluates the weights it ends with.
  if (c.start_step < 0 || c.start_step > total_steps) {
    throw InvalidArgument("start_step (--resume) is " + std::to_string(c.start_step) + " of a run of " +
                          std::to_string(total_steps) + " steps: " +
                          (c.start_step > 0 ? "past the run's last step." : "it cannot be negative."));
  }
  if (c.start_step > 0 && (!c.initial_params || !c.initial_optimizer_state)) {
    throw InvalidArgument(
        "start_step (--resume) needs the checkpoint's weights and optimizer state "
        "(initial_params, initial_optimizer_state).");
  }
  if (c.initial_optimizer_state) {
    const auto optimizer = make_optimizer(c, probe->layout().numel());
    if (c.initial_optimizer_state->size() != optimizer->state().size() || c.initial_optimizer_steps < 0) {
      throw InvalidArgument("initial optimizer state holds " +
                            std::to_string(c.initial_optimizer_state->size()) + " values but " +
                            optimizer->describe() + " has " + std::to_string(optimizer->state().size()));
    }
  }
  if (c.checkpoint_every < 0)
    throw InvalidArgument("checkpoint_every (--checkpoint-every) cannot be negative");
  const std::int64_t warmup = c.warmup_steps < total_steps ? std::max<std::int64_t>(0, c.warmup_steps) : 0;
  return {std::move(sampler), total_steps, warmup, std::move(probe)};
}

// What differs by replica goes into a checkpoint replica by replica
// (TrainConfig::initial_replica_buffers): resuming, rank 0 scatters each
// replica its own, for as many replicas as there were. `root`: whether this
// process holds rank 0 (the others' parts are not read).
void check_checkpointing(const TrainConfig& c, const nn::Model& probe, bool root) {
  if (!c.initial_optimizer_state || !root) return;
  const auto floats = [](const std::shared_ptr<const std::vector<float>>& v) { return v ? v->size() : 0; };
  const std::string wrong = detail::replica_parts_mismatch(c, probe, floats(c.initial_replica_buffers),
                                                           floats(c.initial_error_feedback));
  if (!wrong.empty()) {
    throw InvalidArgument(
        "resuming (start_step, --resume): initial_replica_buffers and initial_error_feedback hold " + wrong +
        "; give each replica's part, as the checkpoint (Checkpoint::replica_buffers, "
        "error_feedback) has them.");
  }
}

}  // namespace lockstep::train::detail
