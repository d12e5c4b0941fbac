#include "lockstep/train/trainer.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <set>
#include <thread>

#include "assemble_result.h"
#include "gather_timeline.h"
#include "guards.h"
#include "lockstep/comm/threads.h"
#include "lockstep/error.h"
#include "lockstep/nn/gemm.h"
#include "replica.h"
#include "run_plan.h"
#include "user_model.h"

namespace lockstep::train {

std::unique_ptr<nn::Model> make_model(const TrainConfig& config, std::int64_t features,
                                      std::int64_t classes) {
  if (!config.model_factory) {
    if (config.model == "cnn") return nn::make_cnn(1, 28, 28, classes);
    return nn::make_mlp(features, config.hidden, classes);
  }
  auto model = config.model_factory(features, classes);
  const std::string of = "TrainConfig::model_factory (model '" + config.model + "')";
  if (!model) throw InvalidArgument(of + " returned no model (null); it must build one on every call.");
  if (model->in_features() != features || model->out_features() != classes) {
    throw InvalidArgument(of + " built a model of " + std::to_string(model->in_features()) + " inputs and " +
                          std::to_string(model->out_features()) + " outputs, for data of " +
                          std::to_string(features) + " features and " + std::to_string(classes) +
                          " classes.");
  }
  if (model->layout().numel() == 0)
    throw InvalidArgument(of + " built " + model->describe() + ", which has no parameters to train.");
  return model;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::size_t numel) {
  if (c.optimizer == "adamw") return optim::make_adamw(numel, {.weight_decay = c.weight_decay});
  return optim::make_sgd(numel,
                         {.momentum = c.momentum, .weight_decay = c.weight_decay, .nesterov = c.nesterov});
}

namespace {

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

// What each replica copies: the config without its starting state (read
// from the shared config), a user's model factory checked and serialised
// (Note [A model of the user's own]). `probe` must outlive the replicas.
TrainConfig replica_settings(const TrainConfig& c, const nn::Model& probe) {
  TrainConfig settings = detail::without_starting_state(c);
  if (c.model_factory) settings.model_factory = detail::one_call_at_a_time(c, probe);
  return settings;
}

}  // namespace

std::int64_t total_steps(const TrainConfig& config, const data::ImageClassificationData& data) {
  return detail::plan(config, data).total_steps;
}

std::vector<std::pair<std::string, std::string>> trajectory_fields(const TrainConfig& config,
                                                                   const data::ImageClassificationData& data,
                                                                   const std::string& transport) {
  const detail::Plan p = detail::plan(config, data);
  // The handshake's fields, less those that change no weight: how often the
  // run reports, checks and evaluates, the faults it injects, and the build
  // (a resumed run may be a rebuilt binary's).
  static const std::set<std::string> kNoWeight = {
      "build version",   "--log-every",   "stop poll (TrainConfig::stop_poll_ms)",
      "test evaluation", "--check-every", "--on-divergence",
      "--max-skips",     "--inject",      "--resume (the step it goes on from, the optimizer's updates)"};
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
  detail::Plan p = detail::plan(c, data);
  detail::check_checkpointing(c, *p.probe, true);
  const BlasThreads blas_threads(c.replicas, c.cores,
                                 c.deterministic);  // every replica is a thread of this process

  auto comms = comm::make_thread_group(
      {.world_size = c.replicas, .timeout = c.timeout, .ranks_per_node = c.ranks_per_node});
  if (c.link.enabled()) comms = comm::with_modelled_link(std::move(comms), c.link);
  const TrainConfig settings = replica_settings(c, *p.probe);
  detail::Shared shared{c,         settings,      data,     hooks,
                        p.sampler, p.total_steps, p.warmup, std::chrono::steady_clock::now()};
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
  return detail::assemble(c, p, outputs);
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
  detail::Plan p = detail::plan(c, data);
  detail::check_checkpointing(c, *p.probe, comm.rank() == 0);
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
      comm.abort(rank +
                 " failed: " + (what.rfind(rank + ": ", 0) == 0 ? what.substr(rank.size() + 2) : what));
      throw;
    }
  };
  const TrainConfig settings = replica_settings(c, *p.probe);
  detail::Shared shared{c,
                        settings,
                        data,
                        hooks,
                        p.sampler,
                        p.total_steps,
                        p.warmup,
                        std::chrono::steady_clock::now(),
                        /*timeline_from_rank0=*/true};
  shared.inputs_digest = detail::inputs_digest(data);
  std::vector<detail::ReplicaOutput> outputs(1);
  or_abort([&] { outputs[0] = detail::run_replica(shared, comm); });
  const bool recorded = outputs[0].recorded_timeline;
  TrainResult result = detail::assemble(c, p, outputs);
  // Note [Lost after the last step]: the weights are final and compared on
  // every rank here; what follows only gathers what the outputs report. A
  // rank lost now fails the run, but rank 0 still holds what it trained:
  // the hook gets it before the failure is thrown (lockstep train writes
  // --save from it; the report, which needs every rank's traffic, is not).
  try {
    result.traffic = or_abort([&] { return detail::gather_traffic(comm, result.traffic[0]); });
    // The trace and the SVG draw every rank, on rank 0's clock.
    if (recorded)
      result.timeline =
          or_abort([&] { return detail::gather_timeline(comm, std::move(result.timeline), shared.t0); });
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
