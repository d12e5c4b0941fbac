// Deterministic mode's pieces (atoms.h, Note [Bit-exact for any replica count]).
#include "atoms.h"

#include <algorithm>

#include "lockstep/error.h"

namespace lockstep::train::detail {
namespace {

bool power_of_two(std::int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

void validate_deterministic(const TrainConfig& c) {
  if (!c.deterministic) return;
  const std::int64_t rows = c.micro_batch * c.accumulate;
  if (!power_of_two(c.replicas)) {
    throw InvalidArgument("--deterministic needs a power-of-two number of replicas (1, 2, 4, 8, ...), not " +
                          std::to_string(c.replicas) + ".");
  }
  if (c.atom < 1 || rows % c.atom != 0 || !power_of_two(rows / c.atom)) {
    throw InvalidArgument("--deterministic needs --micro-batch (x --accumulate) to be a power-of-two number of "
                          "atoms; " + std::to_string(rows) + " samples per replica with --atom " +
                          std::to_string(c.atom) + " is not.");
  }
  if (c.compression != ddp::Compression::None) {
    throw InvalidArgument("--deterministic sums float32 gradients in a fixed tree; drop --compress.");
  }
  if (c.algorithm != comm::Algorithm::Auto && c.algorithm != comm::Algorithm::Tree) {
    throw InvalidArgument("--deterministic uses the tree all-reduce; drop --algorithm.");
  }
}

void AtomTree::add(std::span<const float> atom) {
  LOCKSTEP_CHECK(atom.size() == width_, "atom vector of the wrong width");
  std::copy(atom.begin(), atom.end(), carry_.begin());
  std::size_t k = 0;
  for (; k < full_.size() && full_[k]; ++k) {  // carry up: the earlier (left) subtree + the later
    const float* left = level_[k].data();
    float* right = carry_.data();
    for (std::size_t i = 0; i < width_; ++i) right[i] = left[i] + right[i];
    full_[k] = 0;
  }
  if (k == level_.size()) {
    level_.emplace_back(width_);
    full_.push_back(0);
  }
  level_[k].swap(carry_);
  full_[k] = 1;
}

std::span<float> AtomTree::total() {
  const auto n = std::count(full_.begin(), full_.end(), char{1});
  LOCKSTEP_CHECK(n == 1, "the atom tree needs a power-of-two count of atoms");
  const auto k = static_cast<std::size_t>(std::find(full_.begin(), full_.end(), char{1}) - full_.begin());
  full_[k] = 0;
  root_.swap(level_[k]);
  level_[k].resize(width_);
  return root_;
}

}  // namespace lockstep::train::detail
