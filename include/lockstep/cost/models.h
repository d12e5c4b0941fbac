// Built-in models and devices, so `lockstep plan` can answer without a
// profile. Layer parameter counts are exact (MLP, ResNet, VGG computed from
// the architecture; Inception V3 per module, summing to the paper's 23.8M);
// compute times come from FLOPs and the device's achieved FLOP/s, which is an
// assumption stated with each device (docs/cost-model.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/cost/profile.h"

namespace lockstep::cost {

struct Device {
  std::string name;
  double flops = 0;             // achieved FLOP/s on this model's layers (not the datasheet peak)
  double memory_bytes = 0;      // per device
  double memory_bandwidth = 0;  // bytes/s; the optimizer and the gamma term run at this speed
};

// "cpu" (one core of the project machine), "p100", "v100", "a100".
// Throws InvalidArgument naming the choices.
Device device_preset(std::string_view name);

struct LayerShape {
  std::string name;
  double params = 0;             // count, fp32
  double forward_flops = 0;      // per sample
  double backward_flops = 0;     // per sample: weight gradients + input gradients
  double activation_floats = 0;  // saved for backward, per sample
};

struct ModelSpec {
  std::string name;
  std::vector<LayerShape> layers;  // forward order
  double params() const;
  double flops_per_sample() const;  // forward + backward
};

// 784 -> hidden... -> 10, ReLU between (the trainer's MLP). Throws
// InvalidArgument for an empty or non-positive width.
ModelSpec mlp_model(std::int64_t inputs, const std::vector<std::int64_t>& hidden, std::int64_t classes);
// "resnet50", "resnet101", "inception3", "vgg16" (ImageNet, 224x224; 299 for Inception).
ModelSpec cnn_model(std::string_view name);

// Times at `micro_batch` on `device`. The optimizer time is the memory
// traffic of its update: `optimizer_passes` x parameter bytes / memory
// bandwidth (SGD with momentum reads p, g, m and writes p, m: 5 passes).
Profile profile_from_spec(const ModelSpec& spec, const Device& device, std::int64_t micro_batch,
                          double optimizer_passes);

}  // namespace lockstep::cost
