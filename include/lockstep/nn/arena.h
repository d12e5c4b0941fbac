// Parameter storage: one contiguous arena per kind of state, with named views.
//
// A replica keeps its parameters, its gradients and its optimizer state in
// three arenas laid out by the same Layout, so "all gradients" is one span
// that a single all-reduce can carry, and tensor `i` sits at the same offset
// in every arena and on every replica.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::nn {

struct TensorSpec {
  std::string name;  // PyTorch state_dict name, e.g. "0.weight"
  std::vector<std::int64_t> shape;
  std::size_t offset = 0;  // in floats, from the start of the arena
  std::size_t numel = 0;
};

// The ordered list of tensors in an arena. Order = registration order.
// The most floats a Layout or an Arena takes (2^60: 4 EiB); more throws
// InvalidArgument instead of wrapping a size around.
inline constexpr std::size_t kMaxFloats = std::size_t{1} << 60;

class Layout {
 public:
  const TensorSpec& add(std::string name, std::vector<std::int64_t> shape);
  std::size_t numel() const { return numel_; }
  std::size_t bytes() const { return numel_ * sizeof(float); }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const TensorSpec* find(std::string_view name) const;  // null if absent

 private:
  std::vector<TensorSpec> tensors_;
  std::size_t numel_ = 0;
};

// The first tensor of `layout` whose values in `all` (an arena's worth,
// laid out by `layout`) hold a NaN or an infinity; null if none.
const TensorSpec* first_nonfinite_tensor(const Layout& layout, std::span<const float> all);

// A zero-initialised, 64-byte aligned float buffer. Move-only.
class Arena {
 public:
  Arena() = default;
  explicit Arena(std::size_t numel);
  std::span<float> span() { return {data_.get(), numel_}; }
  std::span<const float> span() const { return {data_.get(), numel_}; }
  std::span<float> view(const TensorSpec& t) { return span().subspan(t.offset, t.numel); }
  std::span<const float> view(const TensorSpec& t) const { return span().subspan(t.offset, t.numel); }
  std::size_t numel() const { return numel_; }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float[], Free> data_;
  std::size_t numel_ = 0;
};

}  // namespace lockstep::nn
