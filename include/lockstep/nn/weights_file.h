// A model's weights as a safetensors file, named and shaped as in PyTorch.
#pragma once

#include <filesystem>
#include <map>
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

}  // namespace lockstep::nn
