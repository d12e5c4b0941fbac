// Private: deterministic mode (--deterministic --atom A), bit-exact for any
// replica count.
//
// Note [Bit-exact for any replica count]: the global batch is cut into
// atoms of A samples. Each atom's gradient is computed alone, through the
// same kernels with the same shapes whatever N is. Atom gradients are summed
// (never averaged) in one balanced binary tree over atom index: a replica
// sums its own 2^k adjacent atoms (AtomTree), and the tree all-reduce
// (comm/tree_allreduce.cpp) sums the replicas' partial sums as the upper
// levels of the same tree. Division by the global sample count happens once,
// after the sum. Random streams are keyed by global sample index, never by
// rank, and BLAS runs on one thread. With N and atoms per replica powers of
// two, every bit of the weights, optimizer state, buffers and loss is then
// the same for N = 1, 2, 4, 8.
//
// Buffers (batch norm running statistics) are part of the atom's vector:
// each atom starts from the step's buffers, and its change to them is summed
// in the same tree and applied once, divided by the global atom count. The
// atom's loss sum rides along too, so the logged loss is bit-exact as well.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "lockstep/train/trainer.h"

namespace lockstep::train::detail {

// Throws InvalidArgument naming the unmet precondition of --deterministic.
void validate_deterministic(const TrainConfig& c);

// Pairwise sums of atoms in arrival order, as a binary counter: after 2^k
// adds, total() is the balanced binary tree over them, (a0+a1)+(a2+a3)...
class AtomTree {
 public:
  explicit AtomTree(std::size_t width) : width_(width), carry_(width) {}
  // The next atom's vector (width floats).
  void add(std::span<const float> atom);
  // The tree's root; throws Error unless a power-of-two count of atoms was
  // added. Valid until the next add(); empties the tree.
  std::span<float> total();

 private:
  std::size_t width_;
  std::vector<float> carry_;
  std::vector<std::vector<float>> level_;  // level_[k]: the sum of 2^k atoms, if full_[k]
  std::vector<char> full_;
  std::vector<float> root_;
};

}  // namespace lockstep::train::detail
