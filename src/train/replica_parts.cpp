// What of a run's state each replica holds apart, and the config without its
// starting state (declared in replica.h).
#include <string>

#include "replica.h"

namespace lockstep::train::detail {

bool replicas_keep_own_buffers(const TrainConfig& config, const nn::Model& model) {
  return !model.buffer_layout().tensors().empty() && config.bn_stats == BnStats::Local &&
         !config.deterministic && config.replicas > 1;
}

std::string replica_parts_mismatch(const TrainConfig& config, const nn::Model& model,
                                   std::size_t replica_buffers, std::size_t error_feedback) {
  const auto check = [&](std::size_t floats, bool kept, std::size_t per_replica, const char* names,
                         const char* setting) -> std::string {
    const std::size_t want = kept ? per_replica * std::size_t(config.replicas) : 0;
    if (floats == want) return "";
    const std::size_t have = per_replica == 0 ? 0 : floats / per_replica;
    return std::string(names) + " for " + std::to_string(have) + " replicas, but " +
           (kept ? "a run with " + std::string(setting) + " and " + std::to_string(config.replicas) +
                       " replicas keeps them for each"
                 : "a run with these settings keeps none");
  };
  auto wrong = check(replica_buffers, replicas_keep_own_buffers(config, model), model.buffer_layout().numel(),
                     "'replica.<r>.*' batch-norm statistics", "--bn-stats local");
  if (wrong.empty()) {
    wrong = check(error_feedback, config.compression == ddp::Compression::Bf16, model.layout().numel(),
                  "'error_feedback.<r>.*' rounding errors", "--compress bf16");
  }
  return wrong;
}

TrainConfig without_starting_state(const TrainConfig& config) {
  TrainConfig c = config;
  c.initial_params.reset();
  c.initial_buffers.reset();
  c.initial_optimizer_state.reset();
  c.initial_replica_buffers = c.initial_error_feedback = nullptr;
  return c;
}

}  // namespace lockstep::train::detail
