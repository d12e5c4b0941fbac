#include "lockstep/nn/arena.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "lockstep/error.h"

namespace lockstep::nn {

const TensorSpec& Layout::add(std::string name, std::vector<std::int64_t> shape) {
  if (find(name) != nullptr) throw InvalidArgument("tensor name '" + name + "' is used twice");
  // At most kMaxFloats in a tensor and in the layout: an Arena of them has
  // a byte size that fits (and a product that wrapped would look small).
  std::size_t numel = 1;
  for (auto d : shape) {
    if (d <= 0) throw InvalidArgument("tensor '" + name + "' has a non-positive dimension");
    if (static_cast<std::size_t>(d) > kMaxFloats / numel) {
      throw InvalidArgument("tensor '" + name + "' has more elements than any machine can hold");
    }
    numel *= static_cast<std::size_t>(d);
  }
  if (numel > kMaxFloats - numel_) {
    throw InvalidArgument("tensor '" + name + "' takes the layout past the elements any machine can hold");
  }
  tensors_.push_back({std::move(name), std::move(shape), numel_, numel});
  numel_ += numel;
  return tensors_.back();
}

const TensorSpec* Layout::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorSpec* first_nonfinite_tensor(const Layout& layout, std::span<const float> all) {
  for (const auto& t : layout.tensors()) {
    const auto values = all.subspan(t.offset, t.numel);
    if (std::any_of(values.begin(), values.end(), [](float v) { return !std::isfinite(v); })) return &t;
  }
  return nullptr;
}

void Arena::Free::operator()(float* p) const {
  std::free(p);
}

Arena::Arena(std::size_t numel) : numel_(numel) {
  if (numel > kMaxFloats) {
    throw InvalidArgument("an arena of " + std::to_string(numel) +
                          " floats is more than any machine can hold");
  }
  const std::size_t bytes = ((numel * sizeof(float) + 63) / 64) * 64;
  if (bytes == 0) return;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  data_.reset(static_cast<float*>(p));
}

}  // namespace lockstep::nn
