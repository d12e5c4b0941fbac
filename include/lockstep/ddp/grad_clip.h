// Clipping the averaged gradient to an L2 norm over every parameter
// (torch.nn.utils.clip_grad_norm_), with the same norm, to the bit, on every
// replica: otherwise each would scale by its own factor and the replicas
// would drift apart. Note [Clipping the averaged gradient] in grad_clip.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/ddp/reducer.h"

namespace lockstep::ddp {

// The sum of the squares of `values`, in double, in one fixed order: eight
// interleaved sums (element i goes to sum i mod 8), then added as
// ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)). Each float's square is
// exact in double. The same bits for the same values on every machine.
double sum_of_squares(std::span<const float> values);
// Its naive sibling: one running sum, element by element (other bits; the
// tests hold the two within rounding of each other).
double sum_of_squares_naive(std::span<const float> values);

struct GradClipOptions {
  float max_norm = 0;  // > 0
  // The reducer shards (ReducerOptions::shard): each rank holds the mean
  // only in its own ranges (owned_ranges()), so the ranks exchange their
  // shares of the norm: one double each (clip() is then a collective).
  bool sharded = false;
  // Every rank holds the whole mean, and the norm must not depend on the
  // number of replicas (train --deterministic): summed over the whole
  // gradient as one span, whatever the buckets and ranks.
  bool deterministic = false;
};

struct GradClipResult {
  double norm = 0;       // of the averaged gradient, before clipping
  bool clipped = false;  // norm > max_norm: the gradient was scaled
};

class GradClipper {
 public:
  // `buckets` and `world_size` as the reducer's; `numel`: the gradient's floats.
  GradClipper(const std::vector<Bucket>& buckets, int rank, int world_size, std::size_t numel,
              const GradClipOptions& options);

  // Every rank calls it at the same step, after the reducer's finish_step()
  // and before the optimizer. Computes the norm; if it is over max_norm,
  // multiplies the gradient (this rank's ranges, sharded) by
  // max_norm / (norm + 1e-6), as torch does. Throws InvalidArgument if
  // `grads` is not `numel` floats; collective errors when sharded.
  // The same as scale(grads, total_sum(comm, local_sum(grads))).
  GradClipResult clip(comm::Communicator& comm, std::span<float> grads) const;

  // clip()'s three steps, for a caller that times the exchange apart:
  // this rank's sum of squares (every part's, unless it exchanges);
  bool exchanges() const { return exchange_; }
  double local_sum(std::span<const float> grads) const;
  // the whole sum (a collective if exchanges(): one all-reduce of 4N floats);
  double total_sum(comm::Communicator& comm, double local) const;
  // the norm, and the scaling if it is over max_norm.
  GradClipResult scale(std::span<float> grads, double total) const;

 private:
  void check_size(std::size_t floats) const;
  // The norm's terms: part k is a list of ranges; norm^2 = the sum over k,
  // in order, of the sums of squares of part k's ranges, in order.
  std::vector<std::vector<GradRange>> parts_;
  int rank_;
  std::size_t numel_;
  GradClipOptions options_;
  bool exchange_;  // sharded and not deterministic: each rank sums its own part only
};

}  // namespace lockstep::ddp
