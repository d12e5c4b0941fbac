#include "lockstep/nn/weights_file.h"

#include <algorithm>

#include "lockstep/error.h"
#include "lockstep/nn/safetensors.h"

namespace lockstep::nn {
namespace {

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

void save_weights(const std::filesystem::path& path, const Layout& layout, std::span<const float> params,
                  const std::map<std::string, std::string>& metadata) {
  LOCKSTEP_REQUIRE(params.size() == layout.numel(), "save_weights: " + std::to_string(params.size()) +
                                                      " floats for a layout of " + std::to_string(layout.numel()));
  std::vector<TensorRef> refs;
  for (const auto& t : layout.tensors()) refs.push_back({t.name, t.shape, params.subspan(t.offset, t.numel)});
  save_safetensors(path, refs, metadata);
}

std::vector<float> load_weights(const std::filesystem::path& path, const Layout& layout) {
  SafetensorsFile file = load_safetensors(path);
  std::vector<float> out(layout.numel());
  for (const auto& t : layout.tensors()) {
    auto it = std::find_if(file.tensors.begin(), file.tensors.end(),
                           [&](const TensorData& d) { return d.name == t.name; });
    if (it == file.tensors.end()) {
      throw IoError(path.string() + ": tensor '" + t.name + "' " + shape_str(t.shape) +
                    " is missing; the file was saved from a different model.");
    }
    if (it->shape != t.shape) {
      throw IoError(path.string() + ": tensor '" + t.name + "' has shape " + shape_str(it->shape) +
                    " but the model needs " + shape_str(t.shape) + "; check --model, --hidden and the data set.");
    }
    std::copy(it->data.begin(), it->data.end(), out.begin() + static_cast<std::ptrdiff_t>(t.offset));
  }
  for (const auto& d : file.tensors) {
    if (layout.find(d.name) == nullptr) {
      throw IoError(path.string() + ": tensor '" + d.name +
                    "' is not part of the model; the file was saved from a different model.");
    }
  }
  return out;
}

}  // namespace lockstep::nn
