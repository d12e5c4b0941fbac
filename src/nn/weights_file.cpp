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

const TensorData* find_tensor(const SafetensorsFile& file, const std::string& name) {
  const auto it =
      std::find_if(file.tensors.begin(), file.tensors.end(), [&](const TensorData& d) { return d.name == name; });
  return it == file.tensors.end() ? nullptr : &*it;
}

// The tensors of `layout` from `file`, in layout order; IoError names the
// first missing or mis-shaped one.
std::vector<float> read_layout(const std::filesystem::path& path, const SafetensorsFile& file, const Layout& layout) {
  std::vector<float> out(layout.numel());
  for (const auto& t : layout.tensors()) {
    const TensorData* d = find_tensor(file, t.name);
    if (d == nullptr) {
      throw IoError(path.string() + ": tensor '" + t.name + "' " + shape_str(t.shape) +
                    " is missing; the file was saved from a different model.");
    }
    if (d->shape != t.shape) {
      throw IoError(path.string() + ": tensor '" + t.name + "' has shape " + shape_str(d->shape) +
                    " but the model needs " + shape_str(t.shape) + "; check the model and its hidden sizes (--model, --hidden) and the data set.");
    }
    std::copy(d->data.begin(), d->data.end(), out.begin() + static_cast<std::ptrdiff_t>(t.offset));
  }
  return out;
}

}  // namespace

void save_weights(const std::filesystem::path& path, const Layout& layout, std::span<const float> params,
                  const std::map<std::string, std::string>& metadata) {
  save_weights(path, layout, params, Layout{}, {}, metadata);
}

void save_weights(const std::filesystem::path& path, const Layout& layout, std::span<const float> params,
                  const Layout& buffer_layout, std::span<const float> buffers,
                  const std::map<std::string, std::string>& metadata) {
  LOCKSTEP_REQUIRE(params.size() == layout.numel(), "save_weights: " + std::to_string(params.size()) +
                                                      " floats for a layout of " + std::to_string(layout.numel()));
  LOCKSTEP_REQUIRE(buffers.size() == buffer_layout.numel(),
                   "save_weights: " + std::to_string(buffers.size()) + " buffer floats for a layout of " +
                       std::to_string(buffer_layout.numel()));
  std::vector<TensorRef> refs;
  for (const auto& t : layout.tensors()) refs.push_back({t.name, t.shape, params.subspan(t.offset, t.numel)});
  for (const auto& t : buffer_layout.tensors())
    refs.push_back({t.name, t.shape, buffers.subspan(t.offset, t.numel)});
  save_safetensors(path, refs, metadata);
}

std::vector<float> load_weights(const std::filesystem::path& path, const Layout& layout) {
  return load_state(path, layout, Layout{}).params;
}

LoadedState load_state(const std::filesystem::path& path, const Layout& layout, const Layout& buffer_layout) {
  const SafetensorsFile file = load_safetensors(path);
  LoadedState out{.params = read_layout(path, file, layout)};
  const auto held = std::count_if(buffer_layout.tensors().begin(), buffer_layout.tensors().end(),
                                  [&](const TensorSpec& t) { return find_tensor(file, t.name) != nullptr; });
  if (held > 0) out.buffers = read_layout(path, file, buffer_layout);  // some: then all, or IoError
  for (const auto& d : file.tensors) {
    if (layout.find(d.name) == nullptr && buffer_layout.find(d.name) == nullptr) {
      throw IoError(path.string() + ": tensor '" + d.name +
                    "' is not part of the model; the file was saved from a different model.");
    }
  }
  return out;
}

}  // namespace lockstep::nn
