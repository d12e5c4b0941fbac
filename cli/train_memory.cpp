#include "train_memory.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "commands.h"
#include "host_memory.h"
#include "lockstep/cost/models.h"
#include "lockstep/cost/plan.h"
#include "lockstep/error.h"

namespace lockstep::cli {

// The MLP counted by the cost model (as lockstep plan counts it), not built:
// a probe model would itself zero gigabytes first. The built-in CNN is small:
// built, and counted as Model keeps it per sample, every layer's output and
// two buffers of upstream gradients as wide as the widest (~350 KB).
ModelSize model_size(const train::TrainConfig& c, const data::ImageClassificationData& data) {
  ModelSize size;
  if (c.model == "mlp") {
    const cost::ModelSpec spec = cost::mlp_model(data.train.features, c.hidden, data.train.num_classes);
    size.params = spec.params();
    for (const cost::LayerShape& l : spec.layers) size.activation_floats += l.activation_floats;
    return size;
  }
  const auto model = train::make_model(c, data.train.features, data.train.num_classes);
  size.params = double(model->layout().numel());
  double widest = 0;
  for (std::size_t i = 0; i < model->layer_count(); ++i) {
    const auto out = double(model->layer(i).out_features());
    size.activation_floats += out;
    widest = std::max(widest, out);
  }
  size.activation_floats += 2 * widest;
  return size;
}

// Every replica holds its weights, gradients and optimizer state (and, with
// --compress bf16, its error feedback and a bf16 copy), and the MLP's
// activations of a micro-batch (each Linear's input and output, a lower
// bound: backward needs as much again for their gradients). When that alone
// is more than the host has free, the run is refused now: otherwise the
// kernel's OOM killer ends it part way, without a word. The process that
// writes checkpoints also keeps a copy of one, and gathers the parts the
// replicas hold apart to make it.
void check_memory(const train::TrainConfig& c, const data::ImageClassificationData& data, int replicas_here,
                  bool checkpoint_copy) {
  const auto [params, activation_floats] = model_size(c, data);
  const char* widths = c.model == "mlp" ? " or --hidden" : "";
  const cost::Optimizer optimizer = c.optimizer == "adamw" ? cost::Optimizer::AdamW
                                    : c.momentum > 0       ? cost::Optimizer::Momentum
                                                           : cost::Optimizer::Sgd;
  const double shards = c.zero == 1 ? std::max(1, c.replicas) : 1;  // --zero 1: 1/N of the state each
  const double copies = 2 + cost::optimizer_state_factor(optimizer) / shards +
                        (c.compression == ddp::Compression::Bf16 ? 1.5 : 0);
  const double state = params * sizeof(float) * copies;
  const double activations = activation_floats * double(c.micro_batch) * sizeof(float);
  // The copy (weights, the whole optimizer state, with bf16 every replica's
  // rounding error), and what rank 0 gathers while it makes it (under --zero 1
  // the whole state, with bf16 the rounding errors).
  const double slots = cost::optimizer_state_factor(optimizer);
  const double bf16_parts = c.compression == ddp::Compression::Bf16 ? double(c.replicas) : 0;
  const double checkpoint =
      checkpoint_copy
          ? params * sizeof(float) * (1 + slots + bf16_parts + (c.zero == 1 ? slots : 0) + bf16_parts)
          : 0;
  const double need = replicas_here * (state + activations) + checkpoint;
  const std::optional<double> available = available_memory_bytes();
  if (available && need > *available) {
    char text[448];
    const char* copy_text = checkpoint > 0 ? ", with a checkpoint's copy (--checkpoint)," : "";
    if (activations > state) {
      std::snprintf(
          text, sizeof text,
          "this run needs at least %s for %d replicas' activations of %lld samples each (%s per replica) "
          "and their weights, gradients and optimizer state%s on this host, and it has %s free; lower "
          "--micro-batch or --replicas (or the processes per host)%s.",
          show_bytes(need).c_str(), replicas_here, static_cast<long long>(c.micro_batch),
          show_bytes(activations).c_str(), copy_text, show_bytes(*available).c_str(), widths);
    } else {
      std::snprintf(
          text, sizeof text,
          "this run needs at least %s for %d replicas' weights, gradients and optimizer state (%.3g "
          "parameters each) and activations%s on this host, and it has %s free; lower --replicas (or "
          "the processes per host)%s.",
          show_bytes(need).c_str(), replicas_here, params, copy_text, show_bytes(*available).c_str(), widths);
    }
    throw InvalidArgument(text);
  }
}

}  // namespace lockstep::cli
