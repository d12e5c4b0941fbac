#include "validate_config.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "atoms.h"
#include "lockstep/error.h"
#include "user_model.h"

namespace lockstep::train::detail {
namespace {

// A data set as train() reads it: every array as long as its sizes say
// (a set built in code can disagree with itself), every label a class of
// the model, and the test set shaped as the training set. Before this, a
// short `inputs` was read past its end.
void check_dataset(const data::Dataset& d, const std::string& which, const data::Dataset& train) {
  const std::string name = "the " + which + " set";
  if (d.size <= 0) throw InvalidArgument(name + " is empty (size " + std::to_string(d.size) + ").");
  if (d.features <= 0)
    throw InvalidArgument(name + " has " + std::to_string(d.features) + " features per sample.");
  if (d.features > static_cast<std::int64_t>(d.inputs.max_size()) / d.size ||
      d.inputs.size() != static_cast<std::size_t>(d.size * d.features)) {
    throw InvalidArgument(name + " says " + std::to_string(d.size) + " samples of " +
                          std::to_string(d.features) + " features, but its inputs hold " +
                          std::to_string(d.inputs.size()) + " floats.");
  }
  if (d.labels.size() != static_cast<std::size_t>(d.size)) {
    throw InvalidArgument(name + " says " + std::to_string(d.size) + " samples, but it has " +
                          std::to_string(d.labels.size()) + " labels.");
  }
  if (d.features != train.features) {
    throw InvalidArgument(name + " has " + std::to_string(d.features) +
                          " features per sample and the training set " + std::to_string(train.features) +
                          "; the model takes one width.");
  }
  // One class: the loss is 0 whatever the weights, and the test accuracy 1.
  if (train.num_classes < 2) {
    throw InvalidArgument(
        "the training set's labels hold " +
        std::string(train.num_classes == 1 ? "one class (every label is 0)" : "no classes") +
        ", and a classifier needs 2 or more; check the data set's training label file.");
  }
  for (std::size_t i = 0; i < d.labels.size(); ++i) {
    if (d.labels[i] < 0 || d.labels[i] >= train.num_classes) {
      throw InvalidArgument(name + "'s sample " + std::to_string(i) + " has label " +
                            std::to_string(d.labels[i]) + ", outside the model's classes 0.." +
                            std::to_string(train.num_classes - 1) + ".");
    }
  }
}

}  // namespace

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
  check_model_name(c);
  if (c.model == "cnn") {
    // 28x28, or 1x28x28 (one channel); a shape left empty (a set built in code) is not checked.
    const auto is_28x28 = [](std::vector<std::int64_t> shape) {
      while (shape.size() > 2 && shape.front() == 1) shape.erase(shape.begin());
      return shape.empty() || shape == std::vector<std::int64_t>{28, 28};
    };
    if (data.train.features != 28 * 28 || !is_28x28(data.train.shape) || !is_28x28(data.test.shape)) {
      throw InvalidArgument(
          "--model cnn takes 28x28 single-channel images; this data set has " +
          std::to_string(data.train.features) + " values per sample" +
          (data.train.shape.empty() ? std::string() : " (" + data::shape_text(data.train.shape) + ")") + ".");
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
    throw InvalidArgument("stop_poll_ms must be a positive number of milliseconds, got " +
                          std::to_string(c.stop_poll_ms));
  }
  if (!(c.clip_grad_norm >= 0) || !std::isfinite(c.clip_grad_norm)) {
    throw InvalidArgument(
        "--clip-grad-norm must be a positive number (the largest gradient norm to keep), or 0 for "
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
    throw InvalidArgument(
        "--compress bf16 with one replica sends nothing and would only round the gradients to "
        "bf16; leave it out, or use 2 or more replicas.");
  }
  if (c.compression == ddp::Compression::Bf16 && c.algorithm != comm::Algorithm::Auto &&
      c.algorithm != comm::Algorithm::Ring) {
    throw InvalidArgument(
        std::string("--compress bf16 all-reduces with its own ring (bf16 on the wire, float32 "
                    "sums), so --algorithm ") +
        comm::to_string(c.algorithm) + " would be ignored; leave --algorithm out or use ring.");
  }
  if (c.zero != 0 && c.zero != 1) {
    throw InvalidArgument("--zero " + std::to_string(c.zero) +
                          ": lockstep trains with stage 0 (replicated) or 1 (sharded optimizer state)" +
                          (c.zero == 2 || c.zero == 3
                               ? std::string("; stages 2 and 3 are not trained, but every "
                                             "lockstep plan prices them among its alternatives.")
                               : std::string(".")));
  }
  if (c.zero == 1 && c.replicas == 1) {
    throw InvalidArgument(
        "--zero 1 shards the optimizer state over the replicas, and one replica has nothing to "
        "shard with; leave it out, or use 2 or more replicas.");
  }
  if (c.zero == 1 && c.compression == ddp::Compression::Bf16) {
    throw InvalidArgument(
        "--zero 1 reduce-scatters the gradients in float32; --compress bf16 cannot be combined "
        "with it. Leave one of them out.");
  }
  if (c.zero == 1 && c.algorithm != comm::Algorithm::Auto && c.algorithm != comm::Algorithm::Ring &&
      c.algorithm != comm::Algorithm::SharedMemory) {
    throw InvalidArgument(
        std::string("--zero 1 reduce-scatters and all-gathers with the ring (or shared memory), "
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
    if ((f.kind == Fault::Kind::BitFlip || f.kind == Fault::Kind::BufferBitFlip) && c.replicas < 2) {
      throw InvalidArgument(
          std::string("--inject ") + flip +
          " needs 2 or more replicas: with one, there is no other replica for the divergence "
          "detector to compare it with.");
    }
    if (f.kind == Fault::Kind::BufferBitFlip && c.bn_stats == BnStats::Local && !c.deterministic) {
      throw InvalidArgument(
          "--inject bitflip-buffer needs --bn-stats sync (or --deterministic): with local "
          "statistics the replicas' buffers differ by design, and the detector leaves them out.");
    }
    if (f.kind == Fault::Kind::SameSeed && c.replicas < 2) {
      throw InvalidArgument(
          "--inject same-seed needs 2 or more replicas: with one, there is no other replica to "
          "read rank 0's shard again.");
    }
    if (f.rank < 0 || f.rank >= c.replicas || f.step < 0) {
      throw InvalidArgument("--inject names rank " + std::to_string(f.rank) + " at step " +
                            std::to_string(f.step) + ", but ranks are 0.." + std::to_string(c.replicas - 1) +
                            " and steps start at 0");
    }
  }
}

}  // namespace lockstep::train::detail
