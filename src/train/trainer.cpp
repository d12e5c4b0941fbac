#include "lockstep/train/trainer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <set>
#include <thread>
#include <type_traits>

#include "lockstep/comm/threads.h"
#include "lockstep/error.h"
#include "lockstep/nn/gemm.h"
#include "atoms.h"
#include "gather_timeline.h"
#include "guards.h"
#include "replica.h"

namespace lockstep::train {
namespace {

// A data set as train() reads it: every array as long as its sizes say
// (a set built in code can disagree with itself), every label a class of
// the model, and the test set shaped as the training set. Before this, a
// short `inputs` was read past its end.
void check_dataset(const data::Dataset& d, const std::string& which, const data::Dataset& train) {
  const std::string name = "the " + which + " set";
  if (d.size <= 0) throw InvalidArgument(name + " is empty (size " + std::to_string(d.size) + ").");
  if (d.features <= 0) throw InvalidArgument(name + " has " + std::to_string(d.features) + " features per sample.");
  if (d.features > static_cast<std::int64_t>(d.inputs.max_size()) / d.size ||
      d.inputs.size() != static_cast<std::size_t>(d.size * d.features)) {
    throw InvalidArgument(name + " says " + std::to_string(d.size) + " samples of " + std::to_string(d.features) +
                          " features, but its inputs hold " + std::to_string(d.inputs.size()) + " floats.");
  }
  if (d.labels.size() != static_cast<std::size_t>(d.size)) {
    throw InvalidArgument(name + " says " + std::to_string(d.size) + " samples, but it has " +
                          std::to_string(d.labels.size()) + " labels.");
  }
  if (d.features != train.features) {
    throw InvalidArgument(name + " has " + std::to_string(d.features) + " features per sample and the training set " +
                          std::to_string(train.features) + "; the model takes one width.");
  }
  // One class: the loss is 0 whatever the weights, and the test accuracy 1.
  if (train.num_classes < 2) {
    throw InvalidArgument("the training set's labels hold " +
                          std::string(train.num_classes == 1 ? "one class (every label is 0)" : "no classes") +
                          ", and a classifier needs 2 or more; check the data set's training label file.");
  }
  for (std::size_t i = 0; i < d.labels.size(); ++i) {
    if (d.labels[i] < 0 || d.labels[i] >= train.num_classes) {
      throw InvalidArgument(name + "'s sample " + std::to_string(i) + " has label " + std::to_string(d.labels[i]) +
                            ", outside the model's classes 0.." + std::to_string(train.num_classes - 1) + ".");
    }
  }
}

void validate(const TrainConfig& c, const data::ImageClassificationData& data) {
  if (c.replicas < 1 || c.replicas > 1024) {
    throw InvalidArgument("--replicas must be between 1 and 1024, got " + std::to_string(c.replicas));
  }
  if (c.micro_batch < 1) {
    throw InvalidArgument("--micro-batch must be at least 1, got " + std::to_string(c.micro_batch));
  }
  // Before anything runs: the reducer refuses it too, but from the replicas'
  // threads (a bucket under a byte would be 0 bytes, one bucket after backward).
  if (c.bucket_mb > 0 && c.bucket_mb * double(1 << 20) < 1) {
    char text[224];
    std::snprintf(text, sizeof text,
                  "--bucket-mb %g is under one byte, which would read as 0, one bucket after backward with "
                  "no overlap; give 0 for that, or at least 1e-6 (MiB).",
                  c.bucket_mb);
    throw InvalidArgument(text);
  }
  if (c.steps < 0 || (c.steps == 0 && c.epochs < 1)) {
    throw InvalidArgument("give a positive number of --epochs or --steps");
  }
  if (c.model != "mlp" && c.model != "cnn") {
    throw InvalidArgument("unknown --model '" + c.model + "'; the choices are: mlp, cnn");
  }
  if (c.model == "cnn") {
    // 28x28, or 1x28x28 (one channel); a shape left empty (a set built in code) is not checked.
    const auto is_28x28 = [](std::vector<std::int64_t> shape) {
      while (shape.size() > 2 && shape.front() == 1) shape.erase(shape.begin());
      return shape.empty() || shape == std::vector<std::int64_t>{28, 28};
    };
    if (data.train.features != 28 * 28 || !is_28x28(data.train.shape) || !is_28x28(data.test.shape)) {
      throw InvalidArgument("--model cnn takes 28x28 single-channel images; this data set has " +
                            std::to_string(data.train.features) + " values per sample" +
                            (data.train.shape.empty() ? std::string() : " (" + data::shape_text(data.train.shape) + ")") +
                            ".");
    }
  }
  if (c.optimizer != "sgd" && c.optimizer != "adamw") {
    throw InvalidArgument("unknown --optimizer '" + c.optimizer + "'; the choices are: sgd, adamw");
  }
  if (!(c.lr > 0) || !std::isfinite(c.lr))
    throw InvalidArgument("--lr must be a positive number that float32 holds (about 1e-38 to 3e38)");
  // NaN fails these tests too: it would make every weight NaN.
  if (!(c.momentum >= 0 && c.momentum <= 1)) throw InvalidArgument("--momentum must be a number from 0 to 1");
  if (!(c.weight_decay >= 0 && std::isfinite(c.weight_decay)))
    throw InvalidArgument("--weight-decay must be a finite number, not negative");
  if (c.log_every < 1) throw InvalidArgument("log interval must be at least 1 step");
  if (!(c.stop_poll_ms > 0) || !std::isfinite(c.stop_poll_ms)) {
    throw InvalidArgument("stop_poll_ms must be a positive number of milliseconds, got " + std::to_string(c.stop_poll_ms));
  }
  if (!(c.clip_grad_norm >= 0) || !std::isfinite(c.clip_grad_norm)) {
    throw InvalidArgument("--clip-grad-norm must be a positive number (the largest gradient norm to keep), or 0 for "
                          "no clipping");
  }
  if (c.lr_warmup < 0) throw InvalidArgument("--lr-warmup must be 0 (none) or a number of steps");
  if (c.accumulate < 1 || c.accumulate > 65536) {
    throw InvalidArgument("--accumulate must be between 1 and 65536, got " + std::to_string(c.accumulate));
  }
  if (c.micro_batch > (std::int64_t{1} << 40) / c.accumulate) {
    throw InvalidArgument("--micro-batch x --accumulate is too large");
  }
  detail::validate_deterministic(c);
  if (c.link.enabled() && c.algorithm == comm::Algorithm::SharedMemory) {
    throw InvalidArgument(
        "--algorithm shared_memory sends no messages, so a modelled link cannot delay it; use auto, ring or "
        "halving_doubling with --link-bandwidth/--link-latency");
  }
  if (c.compression == ddp::Compression::Bf16 && c.replicas == 1) {
    throw InvalidArgument("--compress bf16 with one replica sends nothing and would only round the gradients to "
                          "bf16; leave it out, or use 2 or more replicas.");
  }
  if (c.compression == ddp::Compression::Bf16 && c.algorithm != comm::Algorithm::Auto &&
      c.algorithm != comm::Algorithm::Ring) {
    throw InvalidArgument(std::string("--compress bf16 all-reduces with its own ring (bf16 on the wire, float32 "
                                      "sums), so --algorithm ") +
                          comm::to_string(c.algorithm) + " would be ignored; leave --algorithm out or use ring.");
  }
  if (c.zero != 0 && c.zero != 1) {
    throw InvalidArgument("--zero " + std::to_string(c.zero) +
                          ": lockstep trains with stage 0 (replicated) or 1 (sharded optimizer state)" +
                          (c.zero == 2 || c.zero == 3 ? std::string("; stages 2 and 3 are not trained, but every "
                                                                    "lockstep plan prices them among its alternatives.")
                                                      : std::string(".")));
  }
  if (c.zero == 1 && c.replicas == 1) {
    throw InvalidArgument("--zero 1 shards the optimizer state over the replicas, and one replica has nothing to "
                          "shard with; leave it out, or use 2 or more replicas.");
  }
  if (c.zero == 1 && c.compression == ddp::Compression::Bf16) {
    throw InvalidArgument("--zero 1 reduce-scatters the gradients in float32; --compress bf16 cannot be combined "
                          "with it. Leave one of them out.");
  }
  if (c.zero == 1 && c.algorithm != comm::Algorithm::Auto && c.algorithm != comm::Algorithm::Ring &&
      c.algorithm != comm::Algorithm::SharedMemory) {
    throw InvalidArgument(std::string("--zero 1 reduce-scatters and all-gathers with the ring (or shared memory), "
                                      "so --algorithm ") +
                          comm::to_string(c.algorithm) + " would be ignored; leave --algorithm out or use ring.");
  }
  check_dataset(data.train, "training", data.train);
  // Without evaluation nothing reads the test set, so a program that keeps
  // none passes an empty one (size 0, no inputs, no labels); one that says it
  // holds samples is checked all the same.
  const data::Dataset& test = data.test;
  if (c.evaluate || test.size != 0 || !test.inputs.empty() || !test.labels.empty()) {
    check_dataset(test, "test", data.train);
  }
  if (c.check_every < 0) throw InvalidArgument("--check-every must be 0 (never) or a number of steps");
  if (c.max_skips < 1) throw InvalidArgument("--max-skips must be at least 1");
  if (c.initial_skips_in_a_row < 0)
    throw InvalidArgument("initial_skips_in_a_row (--resume) cannot be negative");
  for (const auto& f : c.inject) {
    // A fault no guard could see would show nothing: refused, as same-seed.
    const char* flip = f.kind == Fault::Kind::BufferBitFlip ? "bitflip-buffer" : "bitflip";
    if (f.kind == Fault::Kind::BufferBitFlip && c.model != "cnn") {
      throw InvalidArgument("--inject bitflip-buffer needs a model with buffers (--model cnn); --model " + c.model +
                            " has none.");
    }
    if ((f.kind == Fault::Kind::BitFlip || f.kind == Fault::Kind::BufferBitFlip) && c.replicas < 2) {
      throw InvalidArgument(std::string("--inject ") + flip +
                            " needs 2 or more replicas: with one, there is no other replica for the divergence "
                            "detector to compare it with.");
    }
    if (f.kind == Fault::Kind::BufferBitFlip && c.bn_stats == BnStats::Local && !c.deterministic) {
      throw InvalidArgument("--inject bitflip-buffer needs --bn-stats sync (or --deterministic): with local "
                            "statistics the replicas' buffers differ by design, and the detector leaves them out.");
    }
    if (f.kind == Fault::Kind::SameSeed && c.replicas < 2) {
      throw InvalidArgument("--inject same-seed needs 2 or more replicas: with one, there is no other replica to "
                            "read rank 0's shard again.");
    }
    if (f.rank < 0 || f.rank >= c.replicas || f.step < 0) {
      throw InvalidArgument("--inject names rank " + std::to_string(f.rank) + " at step " +
                            std::to_string(f.step) + ", but ranks are 0.." + std::to_string(c.replicas - 1) +
                            " and steps start at 0");
    }
  }
}

}  // namespace

const char* to_string(Ragged ragged) {
  switch (ragged) {
    case Ragged::Weighted:
      return "weighted";
    case Ragged::Drop:
      return "drop";
    case Ragged::Pad:
      return "pad";
  }
  return "?";
}

Ragged ragged_from_string(std::string_view name) {
  for (auto r : {Ragged::Weighted, Ragged::Drop, Ragged::Pad})
    if (name == to_string(r)) return r;
  throw InvalidArgument("unknown ragged-shard policy '" + std::string(name) +
                        "'; the choices are: weighted, drop, pad");
}

BnStats bn_stats_from_string(std::string_view name) {
  if (name == "local") return BnStats::Local;
  if (name == "sync") return BnStats::Sync;
  throw InvalidArgument("unknown --bn-stats '" + std::string(name) + "'; the choices are: local, sync");
}

OnDivergence on_divergence_from_string(std::string_view name) {
  if (name == "stop") return OnDivergence::Stop;
  if (name == "repair") return OnDivergence::Repair;
  throw InvalidArgument("unknown --on-divergence '" + std::string(name) + "'; the choices are: stop, repair");
}

Fault fault_from_string(std::string_view spec) {
  const auto bad = [&] {
    return InvalidArgument("bad --inject '" + std::string(spec) +
                           "': expected same-seed, or KIND@STEP:RANK with KIND bitflip, bitflip-buffer, nan or throw, e.g. "
                           "bitflip@20:3");
  };
  if (spec == "same-seed") return Fault{.kind = Fault::Kind::SameSeed};
  const auto at = spec.find('@'), colon = spec.find(':', at == spec.npos ? 0 : at);
  if (at == spec.npos || colon == spec.npos) throw bad();
  Fault f;
  const auto kind = spec.substr(0, at);
  if (kind == "bitflip") {
    f.kind = Fault::Kind::BitFlip;
  } else if (kind == "bitflip-buffer") {
    f.kind = Fault::Kind::BufferBitFlip;
  } else if (kind == "nan") {
    f.kind = Fault::Kind::NaN;
  } else if (kind == "throw") {
    f.kind = Fault::Kind::Throw;
  } else {
    throw bad();
  }
  const auto number = [&](std::string_view text) {
    std::int64_t v = 0;
    if (text.empty() || text.size() > 12) throw bad();
    for (char ch : text) {
      if (ch < '0' || ch > '9') throw bad();
      v = v * 10 + (ch - '0');
    }
    return v;
  };
  f.step = number(spec.substr(at + 1, colon - at - 1));
  const std::int64_t rank = number(spec.substr(colon + 1));
  if (rank > 1024) throw bad();
  f.rank = static_cast<int>(rank);
  return f;
}

std::unique_ptr<nn::Model> make_model(const TrainConfig& config, std::int64_t features,
                                      std::int64_t classes) {
  if (config.model == "cnn") return nn::make_cnn(1, 28, 28, classes);
  return nn::make_mlp(features, config.hidden, classes);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::size_t numel) {
  if (c.optimizer == "adamw") return optim::make_adamw(numel, {.weight_decay = c.weight_decay});
  return optim::make_sgd(numel,
                         {.momentum = c.momentum, .weight_decay = c.weight_decay, .nesterov = c.nesterov});
}

namespace {

// What train() and train_replica() both derive from the config before any
// replica starts.
struct Plan {
  ddp::DistributedSampler sampler;
  std::int64_t total_steps = 0;
  std::int64_t warmup = 0;
  std::unique_ptr<nn::Model> probe;  // describes the model; never trained
};

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
  ddp::DistributedSampler sampler(
      {.dataset_size = data.train.size,
       .world_size = c.replicas,
       .micro_batch = c.micro_batch * c.accumulate,
       .shuffle = c.shuffle,
       .seed = c.seed,
       .last_batch = c.ragged == Ragged::Drop || c.deterministic ? ddp::LastBatch::Drop : ddp::LastBatch::Keep});
  const std::int64_t total_steps = c.steps > 0 ? c.steps : c.epochs * sampler.steps_per_epoch();
  if (c.lr_warmup > total_steps) {
    throw InvalidArgument("--lr-warmup " + std::to_string(c.lr_warmup) + " is longer than the run (" +
                          std::to_string(total_steps) + " steps), which would end before reaching --lr; give a "
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
    const bool checked_step = c.check_every > 0 && ((f.step + 1) % c.check_every == 0 || f.step == total_steps - 1);
    if (f.kind == Fault::Kind::BitFlip && c.zero == 1 && c.replicas > 1 && !checked_step) {
      throw InvalidArgument("--inject bitflip@" + std::to_string(f.step) +
                            " under --zero 1 is seen only by a divergence check in that same step: the next "
                            "all-gather overwrites the flipped weight with its owner's, or copies it to every "
                            "replica, and no comparison sees it then. Flip at a checked step (K-1, 2K-1, ... with "
                            "--check-every K, or the last), or leave out --zero 1.");
    }
  }
  auto probe = make_model(c, data.train.features, data.train.num_classes);
  if (c.initial_params && c.initial_params->size() != probe->layout().numel()) {
    throw InvalidArgument("initial weights hold " + std::to_string(c.initial_params->size()) +
                          " values but the model has " + std::to_string(probe->layout().numel()));
  }
  if (c.initial_buffers && c.initial_buffers->size() != probe->buffer_layout().numel()) {
    throw InvalidArgument("initial buffers hold " + std::to_string(c.initial_buffers->size()) +
                          " values but the model has " + std::to_string(probe->buffer_layout().numel()));
  }
  if (c.zero == 1 && c.replicas > 1 && !c.deterministic) {
    // Note [Non-finite sentinel], sharded: every rank's chunk of the last bucket carries the flag.
    const auto buckets = detail::planned_buckets(c, probe->layout());
    if (buckets.back().numel < static_cast<std::size_t>(c.replicas)) {
      throw InvalidArgument("--zero 1 cuts every gradient bucket into one chunk per replica, but the last bucket holds "
                            "only " + std::to_string(buckets.back().numel) + " values for " +
                            std::to_string(c.replicas) + " replicas; use fewer replicas or a larger model.");
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
    throw InvalidArgument("start_step (--resume) needs the checkpoint's weights and optimizer state "
                          "(initial_params, initial_optimizer_state).");
  }
  if (c.initial_optimizer_state) {
    const auto optimizer = make_optimizer(c, probe->layout().numel());
    if (c.initial_optimizer_state->size() != optimizer->state().size() || c.initial_optimizer_steps < 0) {
      throw InvalidArgument("initial optimizer state holds " + std::to_string(c.initial_optimizer_state->size()) +
                            " values but " + optimizer->describe() + " has " +
                            std::to_string(optimizer->state().size()));
    }
  }
  if (c.checkpoint_every < 0) throw InvalidArgument("checkpoint_every (--checkpoint-every) cannot be negative");
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
  const std::string wrong =
      detail::replica_parts_mismatch(c, probe, floats(c.initial_replica_buffers), floats(c.initial_error_feedback));
  if (!wrong.empty()) {
    throw InvalidArgument("resuming (start_step, --resume): initial_replica_buffers and initial_error_feedback hold " +
                          wrong + "; give each replica's part, as the checkpoint (Checkpoint::replica_buffers, "
                          "error_feedback) has them.");
  }
}

// OpenBLAS's thread count is process-wide: set it for one run, restore it after.
class BlasThreads {
 public:
  // `replicas_here`: the replicas that share this host's cores (`cores`, 0:
  // every online CPU). They get one BLAS thread each, unless there are fewer
  // replicas than cores. Deterministic mode always takes one, so every
  // product is computed the same way for any N.
  BlasThreads(int replicas_here, int cores, bool deterministic) : previous_(nn::blas_threads()) {
    if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    wanted_ = replicas_here >= cores || deterministic ? 1 : std::max(1, cores / replicas_here);
    if (wanted_ != previous_) nn::set_blas_threads(wanted_);
  }
  ~BlasThreads() {
    if (wanted_ != previous_) nn::set_blas_threads(previous_);
  }
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;

 private:
  int previous_, wanted_;
};

// The result from the outputs of the replicas this process ran. `outputs[0]`
// gives the run's shared view (losses and accuracies are all-reduced, so
// every replica holds the same); traffic, step times and the timeline are
// gathered from all of them.
TrainResult assemble(const TrainConfig& c, const Plan& p, std::vector<detail::ReplicaOutput>& outputs) {
  TrainResult res;
  const auto& o = outputs[0];
  const auto& sampler = p.sampler;
  res.replicas = c.replicas;
  res.micro_batch = c.micro_batch;
  res.accumulate = c.accumulate;
  res.global_batch = sampler.global_batch();
  res.steps = o.steps_run;  // p.total_steps, unless stopped early
  res.steps_planned = p.total_steps;
  res.stopped_early = o.stopped_early;
  res.resumed_from_step = c.start_step;
  res.epochs_run = o.epochs_run;
  res.epochs = double(res.steps) / double(sampler.steps_per_epoch());
  res.final_loss = o.final_loss;
  if (o.steps_run > c.start_step) {  // a run of no step (Note [A job that had ended]) has no window
    res.final_loss_first_step = o.final_loss_first_step + 1;
    res.final_loss_last_step = o.steps_run;
    res.final_loss_window_cut = o.final_loss_window_cut;
  }
  res.epoch_test_accuracy = o.epoch_test_accuracy;
  if (!o.epoch_test_accuracy.empty()) res.test_accuracy = o.epoch_test_accuracy.back();
  res.train_seconds = o.train_seconds;
  res.samples_seen = 0;
  for (std::int64_t step = 0; step < res.steps; ++step)
    res.samples_seen += sampler.shard(step % sampler.steps_per_epoch(), 0).global_count;
  // Only when the run reaches it.
  if (const auto last = sampler.shard(sampler.steps_per_epoch() - 1, 0);
      last.global_count < res.global_batch && res.steps >= sampler.steps_per_epoch()) {
    res.last_step_samples = last.global_count;
    res.last_step_min_shard = res.last_step_max_shard = last.end - last.begin;
    for (int r = 1; r < c.replicas; ++r) {
      const auto shard = sampler.shard(sampler.steps_per_epoch() - 1, r);
      res.last_step_min_shard = std::min(res.last_step_min_shard, shard.end - shard.begin);
      res.last_step_max_shard = std::max(res.last_step_max_shard, shard.end - shard.begin);
    }
  }
  if (const std::int64_t left = sampler.dataset_size() - sampler.steps_per_epoch() * sampler.global_batch();
      left > 0 && res.last_step_samples == 0 && res.steps >= sampler.steps_per_epoch()) {
    res.samples_dropped_per_epoch = left;  // --ragged drop, --deterministic: never formed
  }
  std::int64_t timed_samples = 0;
  // The clock restarts when step `warmup` begins (run_replica), if the run
  // reaches it after its first step; otherwise it was timed from its first.
  const std::int64_t first_timed = p.warmup > c.start_step && res.steps > p.warmup ? p.warmup : c.start_step;
  for (std::int64_t step = first_timed; step < res.steps; ++step)
    timed_samples += sampler.shard(step % sampler.steps_per_epoch(), 0).global_count;
  res.samples_per_s = timed_samples > 0 ? double(timed_samples) / o.train_seconds : 0;  // none: a run that had ended
  res.flops_per_sample = p.probe->train_flops_per_sample();
  res.mfu = c.peak_flops > 0 ? res.samples_per_s * res.flops_per_sample / c.peak_flops : 0;
  res.param_count = p.probe->layout().numel();
  res.weight_bytes = p.probe->layout().bytes();
  res.grad_bytes = p.probe->layout().bytes();
  const auto probe_optimizer = make_optimizer(c, p.probe->layout().numel());
  res.optimizer_state_bytes = res.optimizer_state_bytes_whole = probe_optimizer->state().size_bytes();
  res.zero = c.replicas > 1 ? c.zero : 0;
  if (res.zero == 1) {  // the largest shard: chunks differ by up to one value per bucket
    const auto buckets = detail::planned_buckets(c, p.probe->layout());
    const std::size_t slots = probe_optimizer->slot_names().size();
    std::uint64_t largest = 0;
    for (int r = 0; r < c.replicas; ++r) {
      std::uint64_t floats = 0;
      for (const auto& range : ddp::owned_ranges(buckets, r, c.replicas)) floats += range.numel;
      largest = std::max<std::uint64_t>(largest, floats * slots * sizeof(float));
    }
    res.optimizer_state_bytes = largest;
  }
  res.optimizer_description = probe_optimizer->describe();
  // P in the bytes of the wire's type: float32, or bf16 with --compress bf16.
  const std::uint64_t wire_bytes = c.compression == ddp::Compression::Bf16 ? res.grad_bytes / 2 : res.grad_bytes;
  res.allreduce_bytes_per_step_formula = 2 * wire_bytes * static_cast<std::uint64_t>(c.replicas - 1) / c.replicas;
  // One clock for all replicas only when they all ran here.
  if (outputs.size() == static_cast<std::size_t>(c.replicas)) detail::attribute_waits(outputs);
  std::vector<detail::StepSample> samples;
  for (auto& out : outputs) {
    res.traffic.push_back(out.traffic);
    samples.insert(samples.end(), out.steps.begin(), out.steps.end());
    res.timeline.insert(res.timeline.end(), std::make_move_iterator(out.events.begin()),
                        std::make_move_iterator(out.events.end()));
  }
  res.times = detail::median_times(samples);
  res.buckets = o.buckets;
  res.overlapped = o.overlapped;
  res.model_description = p.probe->describe();
  res.layout = p.probe->layout();
  res.buffer_layout = p.probe->buffer_layout();
  res.params = std::move(outputs[0].params);
  res.buffers = std::move(outputs[0].buffers);
  res.handshake_fields = o.handshake_fields;
  res.divergence_checks = o.divergence_checks;
  res.accounting_checks = o.accounting_checks;
  res.buffer_checks_differing = o.buffer_checks_differing;
  res.repairs = o.repairs;
  res.skipped = o.skipped;
  res.grad_norms = o.grad_norms;
  res.clipped_steps = o.clipped_steps;
  return res;
}

// Every rank's traffic, as train() reports it: one small broadcast per rank,
// after the run's own bytes were counted.
std::vector<TrafficBytes> gather_traffic(comm::Communicator& comm, const TrafficBytes& mine) {
  static_assert(std::is_trivially_copyable_v<TrafficBytes>);
  std::vector<TrafficBytes> all(static_cast<std::size_t>(comm.size()));
  all[static_cast<std::size_t>(comm.rank())] = mine;
  for (int r = 0; r < comm.size(); ++r) {
    comm::broadcast(comm, std::as_writable_bytes(std::span(&all[static_cast<std::size_t>(r)], 1)), r);
  }
  return all;
}

}  // namespace

std::int64_t total_steps(const TrainConfig& config, const data::ImageClassificationData& data) {
  return plan(config, data).total_steps;
}

std::vector<std::pair<std::string, std::string>> trajectory_fields(const TrainConfig& config,
                                                                   const data::ImageClassificationData& data,
                                                                   const std::string& transport) {
  const Plan p = plan(config, data);
  // The handshake's fields, less those that change no weight: how often the
  // run reports, checks and evaluates, the faults it injects, and the build
  // (a resumed run may be a rebuilt binary's).
  static const std::set<std::string> kNoWeight = {"build version", "--log-every", "stop poll (TrainConfig::stop_poll_ms)",
                                                  "test evaluation", "--check-every",
                                                  "--on-divergence", "--max-skips", "--inject",
                                                  "--resume (the step it goes on from, the optimizer's updates)"};
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : detail::handshake_fields(config, data, p.total_steps, *p.probe,
                                                detail::planned_buckets(config, p.probe->layout()),
                                                detail::inputs_digest(data))) {
    if (!kNoWeight.contains(f.name)) out.emplace_back(f.name, f.value);
  }
  if (config.algorithm == comm::Algorithm::Auto) {  // an explicit algorithm sums alike on every transport
    out.emplace_back("--algorithm auto's all-reduce (--backend, a modelled link)",
                     transport + (config.link.enabled() ? ", modelled link" : ""));
  }
  return out;
}

TrainResult train(const TrainConfig& c, const data::ImageClassificationData& data, const TrainHooks& hooks) {
  Plan p = plan(c, data);
  check_checkpointing(c, *p.probe, true);
  const BlasThreads blas_threads(c.replicas, c.cores, c.deterministic);  // every replica is a thread of this process

  auto comms =
      comm::make_thread_group({.world_size = c.replicas, .timeout = c.timeout, .ranks_per_node = c.ranks_per_node});
  if (c.link.enabled()) comms = comm::with_modelled_link(std::move(comms), c.link);
  const TrainConfig settings = detail::without_starting_state(c);
  detail::Shared shared{c, settings, data, hooks, p.sampler, p.total_steps, p.warmup, std::chrono::steady_clock::now()};
  shared.inputs_digest = detail::inputs_digest(data);
  std::vector<detail::ReplicaOutput> outputs(c.replicas);
  std::vector<std::exception_ptr> errors(c.replicas);
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < c.replicas; ++r) {
      threads.emplace_back([&, r] {
        try {
          outputs[r] = detail::run_replica(shared, *comms[r]);
        } catch (const std::exception& e) {
          errors[r] = std::current_exception();
          comms[r]->abort("replica " + std::to_string(r) + " failed: " + e.what());
        } catch (...) {
          errors[r] = std::current_exception();
          comms[r]->abort("replica " + std::to_string(r) + " failed");
        }
      });
    }
  }
  rethrow_first_cause(errors);  // not a consequence of another replica's abort
  return assemble(c, p, outputs);
}

TrainResult train_replica(const TrainConfig& c, const data::ImageClassificationData& data,
                          comm::Communicator& comm, const TrainHooks& hooks) {
  if (c.replicas != comm.size()) {
    throw InvalidArgument("rank " + std::to_string(comm.rank()) + ": --replicas " +
                          std::to_string(c.replicas) + " does not match the process group's world size " +
                          std::to_string(comm.size()) + "; leave --replicas out or give the same number");
  }
  if (c.link.enabled()) {
    throw InvalidArgument(
        "a modelled link (--link-bandwidth/--link-latency) is for the threads backend; "
        "a process group has real links");
  }
  Plan p = plan(c, data);
  check_checkpointing(c, *p.probe, comm.rank() == 0);
  const BlasThreads blas_threads(local_world_size(comm.size()), c.cores, c.deterministic);
  comm.set_timeout(c.timeout);

  // A failure here wakes the other processes at once, with the reason,
  // instead of letting them time out.
  const auto or_abort = [&](auto&& body) {
    try {
      return body();
    } catch (const CommAborted&) {
      throw;  // another rank's failure, already named in the reason
    } catch (const std::exception& e) {
      const std::string rank = "rank " + std::to_string(comm.rank()), what = e.what();
      comm.abort(rank + " failed: " + (what.rfind(rank + ": ", 0) == 0 ? what.substr(rank.size() + 2) : what));
      throw;
    }
  };
  const TrainConfig settings = detail::without_starting_state(c);
  detail::Shared shared{c, settings, data, hooks, p.sampler, p.total_steps, p.warmup, std::chrono::steady_clock::now(),
                        /*timeline_from_rank0=*/true};
  shared.inputs_digest = detail::inputs_digest(data);
  std::vector<detail::ReplicaOutput> outputs(1);
  or_abort([&] { outputs[0] = detail::run_replica(shared, comm); });
  const bool recorded = outputs[0].recorded_timeline;
  TrainResult result = assemble(c, p, outputs);
  // Note [Lost after the last step]: the weights are final and compared on
  // every rank here; what follows only gathers what the outputs report. A
  // rank lost now fails the run, but rank 0 still holds what it trained:
  // the hook gets it before the failure is thrown (lockstep train writes
  // --save from it; the report, which needs every rank's traffic, is not).
  try {
    result.traffic = or_abort([&] { return gather_traffic(comm, result.traffic[0]); });
    // The trace and the SVG draw every rank, on rank 0's clock.
    if (recorded)
      result.timeline = or_abort([&] { return detail::gather_timeline(comm, std::move(result.timeline), shared.t0); });
  } catch (...) {
    if (comm.rank() == 0 && hooks.on_lost_after_training) {
      try {
        hooks.on_lost_after_training(result);
      } catch (...) {  // the failure above is the one to report
      }
    }
    throw;
  }
  return result;
}

int local_world_size(int world_size) {
  const char* name = "LOCAL_WORLD_SIZE";
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') {
    name = "OMPI_COMM_WORLD_LOCAL_SIZE";  // mpirun's
    env = std::getenv(name);
  }
  if (env == nullptr || *env == '\0') return world_size;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  if (*end != '\0' || v < 1 || v > world_size) {
    throw InvalidArgument(std::string(name) + " must be between 1 and the world size (" +
                          std::to_string(world_size) + "), got '" + env + "'");
  }
  return static_cast<int>(v);
}

}  // namespace lockstep::train
