// A model's weights as a safetensors file, named and shaped as in PyTorch.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/nn/arena.h"

namespace lockstep::nn {

// Writes every tensor of `layout` from `params` (atomically; see safetensors.h).
void save_weights(const std::filesystem::path& path, const Layout& layout, std::span<const float> params,
                  const std::map<std::string, std::string>& metadata = {});

// Reads a file whose tensors match `layout` exactly (same names and shapes)
// and returns the values in layout order. IoError names the first missing,
// extra or mis-shaped tensor.
std::vector<float> load_weights(const std::filesystem::path& path, const Layout& layout);

// A model's whole state, as PyTorch's state_dict holds it: the parameters of
// `layout`, then the buffers of `buffer_layout` (batch norm's running
// statistics), in one file.
void save_weights(const std::filesystem::path& path, const Layout& layout, std::span<const float> params,
                  const Layout& buffer_layout, std::span<const float> buffers,
                  const std::map<std::string, std::string>& metadata = {});

struct LoadedState {
  std::vector<float> params;                  // in `layout` order
  std::optional<std::vector<float>> buffers;  // in `buffer_layout` order; none if the file holds none
};
// Reads the parameters of `layout` (all of them, as load_weights) and the
// buffers of `buffer_layout`: all or none (a file saved with weights only).
// IoError names a missing, extra or mis-shaped tensor.
LoadedState load_state(const std::filesystem::path& path, const Layout& layout, const Layout& buffer_layout);

}  // namespace lockstep::nn
