#include "lockstep/train/trainer.h"

#include <cmath>
#include <exception>
#include <thread>

#include "lockstep/comm/threads.h"
#include "lockstep/error.h"
#include "lockstep/nn/gemm.h"
#include "replica.h"

namespace lockstep::train {
namespace {

void validate(const TrainConfig& c, const data::ImageClassificationData& data) {
  if (c.replicas < 1 || c.replicas > 1024) {
    throw InvalidArgument("--replicas must be between 1 and 1024, got " + std::to_string(c.replicas));
  }
  if (c.micro_batch < 1) {
    throw InvalidArgument("--micro-batch must be at least 1, got " + std::to_string(c.micro_batch));
  }
  if (c.steps < 0 || (c.steps == 0 && c.epochs < 1)) {
    throw InvalidArgument("give a positive number of --epochs or --steps");
  }
  if (c.model != "mlp" && c.model != "cnn") {
    throw InvalidArgument("unknown --model '" + c.model + "'; the choices are: mlp, cnn");
  }
  if (c.model == "cnn" && data.train.features != 28 * 28) {
    throw InvalidArgument("--model cnn takes 28x28 single-channel images; this data set has " +
                          std::to_string(data.train.features) + " features per sample");
  }
  if (c.optimizer != "sgd" && c.optimizer != "adamw") {
    throw InvalidArgument("unknown --optimizer '" + c.optimizer + "'; the choices are: sgd, adamw");
  }
  if (!(c.lr > 0) || !std::isfinite(c.lr)) throw InvalidArgument("--lr must be a positive number");
  if (c.log_every < 1) throw InvalidArgument("log interval must be at least 1 step");
  if (c.accumulate < 1 || c.accumulate > 65536) {
    throw InvalidArgument("--accumulate must be between 1 and 65536, got " + std::to_string(c.accumulate));
  }
  if (c.micro_batch > (std::int64_t{1} << 40) / c.accumulate) {
    throw InvalidArgument("--micro-batch x --accumulate is too large");
  }
  if (c.link.enabled() && c.algorithm == comm::Algorithm::SharedMemory) {
    throw InvalidArgument(
        "--algorithm shared_memory sends no messages, so a modelled link cannot delay it; use auto, ring or "
        "halving_doubling with --link-bandwidth/--link-latency");
  }
  if (data.train.size == 0 || data.test.size == 0) throw InvalidArgument("the data set is empty");
  if (c.check_every < 0) throw InvalidArgument("--check-every must be 0 (never) or a number of steps");
  if (c.max_skips < 1) throw InvalidArgument("--max-skips must be at least 1");
  for (const auto& f : c.inject) {
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

OnDivergence on_divergence_from_string(std::string_view name) {
  if (name == "stop") return OnDivergence::Stop;
  if (name == "repair") return OnDivergence::Repair;
  throw InvalidArgument("unknown --on-divergence '" + std::string(name) + "'; the choices are: stop, repair");
}

Fault fault_from_string(std::string_view spec) {
  const auto bad = [&] {
    return InvalidArgument("bad --inject '" + std::string(spec) +
                           "': expected KIND@STEP:RANK with KIND bitflip, nan or throw, e.g. bitflip@20:3");
  };
  const auto at = spec.find('@'), colon = spec.find(':', at == spec.npos ? 0 : at);
  if (at == spec.npos || colon == spec.npos) throw bad();
  Fault f;
  const auto kind = spec.substr(0, at);
  if (kind == "bitflip") {
    f.kind = Fault::Kind::BitFlip;
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

TrainResult train(const TrainConfig& c, const data::ImageClassificationData& data, const TrainHooks& hooks) {
  validate(c, data);
  ddp::DistributedSampler sampler(
      {.dataset_size = data.train.size,
       .world_size = c.replicas,
       .micro_batch = c.micro_batch * c.accumulate,
       .shuffle = c.shuffle,
       .seed = c.seed,
       .last_batch = c.ragged == Ragged::Drop ? ddp::LastBatch::Drop : ddp::LastBatch::Keep});
  const std::int64_t total_steps = c.steps > 0 ? c.steps : c.epochs * sampler.steps_per_epoch();
  auto probe = make_model(c, data.train.features, data.train.num_classes);
  if (c.initial_params && c.initial_params->size() != probe->layout().numel()) {
    throw InvalidArgument("initial weights hold " + std::to_string(c.initial_params->size()) +
                          " values but the model has " + std::to_string(probe->layout().numel()));
  }

  // Replicas share the cores: one BLAS thread each, unless there is only one.
  // OpenBLAS's thread count is process-wide: set it for this run, restore it after.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  struct BlasThreads {
    int previous = nn::blas_threads();
    ~BlasThreads() { nn::set_blas_threads(previous); }
  } restore_blas_threads;
  nn::set_blas_threads(c.replicas >= cores ? 1 : std::max(1, cores / c.replicas));

  auto comms = comm::make_thread_group({.world_size = c.replicas, .timeout = c.timeout});
  if (c.link.enabled()) comms = comm::with_modelled_link(std::move(comms), c.link);
  const std::int64_t warmup = c.warmup_steps < total_steps ? std::max<std::int64_t>(0, c.warmup_steps) : 0;
  detail::Shared shared{c, data, hooks, sampler, total_steps, warmup, std::chrono::steady_clock::now()};
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
  // The first error that is not a consequence of another replica's abort.
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommAborted&) {
    } catch (...) {
      throw;
    }
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);

  TrainResult res;
  const auto& o = outputs[0];
  res.replicas = c.replicas;
  res.micro_batch = c.micro_batch;
  res.accumulate = c.accumulate;
  res.global_batch = sampler.global_batch();
  res.steps = total_steps;
  res.epochs_run = o.epochs_run;
  res.final_loss = o.final_loss;
  res.epoch_test_accuracy = o.epoch_test_accuracy;
  if (!o.epoch_test_accuracy.empty()) res.test_accuracy = o.epoch_test_accuracy.back();
  res.train_seconds = o.train_seconds;
  res.samples_seen = 0;
  for (std::int64_t step = 0; step < total_steps; ++step)
    res.samples_seen += sampler.shard(step % sampler.steps_per_epoch(), 0).global_count;
  std::int64_t timed_samples = 0;
  for (std::int64_t step = warmup; step < total_steps; ++step)
    timed_samples += sampler.shard(step % sampler.steps_per_epoch(), 0).global_count;
  res.samples_per_s = double(timed_samples) / o.train_seconds;
  res.flops_per_sample = probe->train_flops_per_sample();
  res.mfu = c.peak_flops > 0 ? res.samples_per_s * res.flops_per_sample / c.peak_flops : 0;
  res.param_count = probe->layout().numel();
  res.weight_bytes = probe->layout().bytes();
  res.grad_bytes = probe->layout().bytes();
  const auto probe_optimizer = make_optimizer(c, probe->layout().numel());
  res.optimizer_state_bytes = probe_optimizer->state().size_bytes();
  res.optimizer_description = probe_optimizer->describe();
  res.allreduce_bytes_per_step_formula =
      2 * res.grad_bytes * static_cast<std::uint64_t>(c.replicas - 1) / c.replicas;
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
  res.model_description = probe->describe();
  res.layout = probe->layout();
  res.buffer_layout = probe->buffer_layout();
  res.params = o.params;
  res.handshake_fields = o.handshake_fields;
  res.divergence_checks = o.divergence_checks;
  res.repairs = o.repairs;
  res.skipped = o.skipped;
  return res;
}

}  // namespace lockstep::train
