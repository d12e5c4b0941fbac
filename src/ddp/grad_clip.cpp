// Clipping the averaged gradient to a global L2 norm (grad_clip.h).
//
// Note [Clipping the averaged gradient]: after the all-reduce every replica
// holds the same mean gradient, so each can compute its norm alone, with no
// communication, provided all sum the squares in the same order: then all
// get the same norm, scale by the same factor, and stay in lockstep. The
// order is fixed by the parts below, never by the thread or machine.
//
// Parts, in order; norm^2 = sum over parts of sum_of_squares over their ranges:
//   default:        part r = rank r's chunk of every bucket (owned_ranges),
//                   r = 0..N-1. Every rank sums all N parts itself.
//   sharded:        the same parts, but rank r holds only part r reduced
//                   (the reduce-scatter left the rest unreduced): it sums
//                   part r, the ranks exchange the N doubles (gather_words:
//                   one all-reduce of N x 4 floats, exact; a ring sends
//                   32 (N-1) bytes per rank) and each adds them in part order. The same terms in the same
//                   order as the default, so --zero 1 keeps --zero 0's bits.
//   deterministic:  one part, the whole gradient: no bucket or rank in the
//                   order, so the norm is the same for any replica count.
// The factor is max_norm / (norm + 1e-6), applied only when it is under 1
// (torch.nn.utils.clip_grad_norm_ multiplies by min(1, factor); times 1 is
// the same bits), as a float, to the ranges the optimizer reads.
#include "lockstep/ddp/grad_clip.h"

#include <bit>
#include <cmath>
#include <string>

#include "lockstep/ddp/replica_digest.h"
#include "lockstep/error.h"

namespace lockstep::ddp {

double sum_of_squares(std::span<const float> values) {
  constexpr std::size_t kLanes = 8;
  double lane[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  const std::size_t n = values.size(), whole = n - n % kLanes;
  const float* v = values.data();
  for (std::size_t i = 0; i < whole; i += kLanes) {
    for (std::size_t k = 0; k < kLanes; ++k) lane[k] += double(v[i + k]) * double(v[i + k]);
  }
  for (std::size_t i = whole; i < n; ++i) lane[i - whole] += double(v[i]) * double(v[i]);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

double sum_of_squares_naive(std::span<const float> values) {
  double sum = 0;
  for (float x : values) sum += double(x) * double(x);
  return sum;
}

GradClipper::GradClipper(const std::vector<Bucket>& buckets, int rank, int world_size, std::size_t numel,
                         const GradClipOptions& options)
    : rank_(rank), numel_(numel), options_(options), exchange_(options.sharded && !options.deterministic) {
  if (!(options.max_norm > 0) || !std::isfinite(options.max_norm)) {
    throw InvalidArgument("gradient clipping needs a positive, finite norm to clip to, got " +
                          std::to_string(options.max_norm));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InvalidArgument("gradient clipping: rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  }
  if (options.deterministic) {
    parts_.push_back({GradRange{0, numel}});
    return;
  }
  std::size_t covered = 0;
  for (int r = 0; r < world_size; ++r) {
    parts_.push_back(owned_ranges(buckets, r, world_size));
    for (const auto& g : parts_.back()) {
      if (g.offset > numel || g.numel > numel - g.offset) {
        throw InvalidArgument("gradient clipping: a bucket runs past the " + std::to_string(numel) +
                              " gradient floats");
      }
      covered += g.numel;
    }
  }
  if (covered != numel) {
    throw InvalidArgument("gradient clipping: the buckets hold " + std::to_string(covered) + " of the " +
                          std::to_string(numel) + " gradient floats");
  }
}

void GradClipper::check_size(std::size_t floats) const {
  if (floats != numel_) {
    throw InvalidArgument("gradient clipping for " + std::to_string(numel_) + " floats got " +
                          std::to_string(floats));
  }
}

double GradClipper::local_sum(std::span<const float> grads) const {
  check_size(grads.size());
  const auto part_sum = [&](const std::vector<GradRange>& part) {
    double sum = 0;
    for (const auto& g : part) sum += sum_of_squares(grads.subspan(g.offset, g.numel));
    return sum;
  };
  if (exchange_) return part_sum(parts_[std::size_t(rank_)]);
  double total = 0;
  for (const auto& part : parts_) total += part_sum(part);
  return total;
}

double GradClipper::total_sum(comm::Communicator& comm, double local) const {
  if (!exchange_) return local;
  const std::uint64_t mine = std::bit_cast<std::uint64_t>(local);
  double total = 0;
  for (const std::uint64_t word : gather_words(comm, std::span(&mine, 1))) total += std::bit_cast<double>(word);
  return total;
}

GradClipResult GradClipper::scale(std::span<float> grads, double total) const {
  check_size(grads.size());
  GradClipResult result{.norm = std::sqrt(total)};
  const double factor = double(options_.max_norm) / (result.norm + 1e-6);
  if (factor < 1) {
    result.clipped = true;
    const float f = static_cast<float>(factor);
    const auto scale_range = [&](const GradRange& g) {
      for (float& x : grads.subspan(g.offset, g.numel)) x *= f;
    };
    if (exchange_) {
      for (const auto& g : parts_[std::size_t(rank_)]) scale_range(g);
    } else {
      scale_range({0, numel_});
    }
  }
  return result;
}

GradClipResult GradClipper::clip(comm::Communicator& comm, std::span<float> grads) const {
  return scale(grads, total_sum(comm, local_sum(grads)));
}

}  // namespace lockstep::ddp
