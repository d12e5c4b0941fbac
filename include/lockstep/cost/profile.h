// A model as the cost model sees it: layers in forward order, each with its
// parameter bytes and its forward and backward time at one micro-batch.
//
// This is also the format of `lockstep train --profile FILE` (JSON, spelled
// out in docs/cost-model.md):
//   {"format": "lockstep-profile", "version": 1,
//    "model": "mlp 784-512-512-10", "replicas": 8, "micro_batch": 32,
//    "step_compute_ms": 4.1,                 // forward + backward + optimizer, one replica
//    "activation_bytes_per_sample": 9312,    // optional, 0 if unknown
//    "layers": [{"name": "1", "param_bytes": 1607680, "forward_ms": 0.40, "backward_ms": 0.61}, ...]}
// Times are per replica per micro-step at `micro_batch`; the optimizer's time
// is what step_compute_ms leaves after the layers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::cost {

struct LayerCost {
  std::string name;
  double param_bytes = 0;  // fp32 bytes of this layer's parameters (= its gradient bytes)
  double forward_ms = 0;
  double backward_ms = 0;  // its gradient is ready when this ends (backward runs last layer first)
};

struct Profile {
  std::string model;
  std::vector<LayerCost> layers;  // forward order
  int replicas = 1;               // of the run that measured it (informational)
  std::int64_t micro_batch = 1;   // the times above are at this micro-batch
  double step_compute_ms = 0;     // forward + backward + optimizer
  double activation_bytes_per_sample = 0;

  double param_bytes() const;
  double forward_ms() const;
  double backward_ms() const;
  double optimizer_ms() const;  // step_compute_ms - forward - backward, never negative
};

// Throws InvalidArgument naming `source` and the bad field (missing, negative,
// not a number, no layers, wrong format tag).
Profile parse_profile(std::string_view json_text, const std::string& source);
// Reads a file; IoError if it cannot be read, else as parse_profile.
Profile read_profile(const std::filesystem::path& path);
std::string profile_to_json(const Profile& profile);

// The same profile with every forward and backward time multiplied by
// `factor` (the optimizer's time unchanged): what a different micro-batch or
// device does to compute, to first order.
Profile scale_compute(const Profile& profile, double factor);

}  // namespace lockstep::cost
