// Front door of all-reduce: argument checks, algorithm choice, shared kernels.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "algorithms.h"
#include "fingerprint.h"
#include "lockstep/error.h"

namespace lockstep::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Mean:
      return "mean";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

const char* to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::Auto:
      return "auto";
    case Algorithm::Ring:
      return "ring";
    case Algorithm::Naive:
      return "naive";
    case Algorithm::HalvingDoubling:
      return "halving_doubling";
    case Algorithm::SharedMemory:
      return "shared_memory";
    case Algorithm::Native:
      return "native";
    case Algorithm::Tree:
      return "tree";
    case Algorithm::Hierarchical:
      return "hierarchical";
  }
  return "?";
}

Algorithm algorithm_from_string(std::string_view name) {
  for (auto a : {Algorithm::Auto, Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Naive,
                 Algorithm::SharedMemory, Algorithm::Native, Algorithm::Tree, Algorithm::Hierarchical}) {
    if (name == to_string(a)) return a;
  }
  throw InvalidArgument("unknown all-reduce algorithm '" + std::string(name) +
                        "'; the choices are auto, ring, halving_doubling, naive, shared_memory, native, tree, "
                        "hierarchical");
}

void check_algorithm(Communicator& comm, Algorithm algorithm) {
  const int n = comm.size();
  if (n == 1) return;
  NativeAllreduce* native = comm.native_allreduce();
  const bool shared = native != nullptr && native->shares_memory();
  if (algorithm == Algorithm::SharedMemory && !shared) {
    throw InvalidArgument("the shared_memory all-reduce needs the threads backend");
  }
  if (algorithm == Algorithm::Native && (native == nullptr || shared)) {
    throw InvalidArgument(
        "the native all-reduce needs a transport library's backend, Gloo or MPI (--backend gloo or mpi)");
  }
  if (algorithm == Algorithm::Tree && (n & (n - 1)) != 0) {
    throw InvalidArgument("the tree all-reduce needs a power-of-two number of ranks, not " + std::to_string(n));
  }
  if (algorithm == Algorithm::Hierarchical) detail::require_node_layout(comm);
}

Algorithm algorithm_for(Communicator& comm, std::size_t bytes, Algorithm requested) {
  if (requested != Algorithm::Auto) return requested;
  // Where the backend shares memory, its native path moves the least memory
  // and synchronises twice; otherwise the ring for large buffers (bandwidth-
  // optimal) and halving-doubling for small ones (2 log2 N rounds instead of
  // 2(N-1)); the ring becomes hierarchical when the ranks sit on several
  // nodes of equal size (fewer bytes through each node's link, fewer
  // rounds). The rule and its measurements: docs/algorithms.md.
  const NativeAllreduce* native = comm.native_allreduce();
  const bool shared = native != nullptr && native->shares_memory();
  const auto layout = shared ? std::nullopt : detail::node_layout(comm);
  const bool hierarchy = layout && layout->nodes > 1 && layout->per_node > 1;
  return shared                                      ? Algorithm::SharedMemory
         : bytes < detail::kHalvingDoublingMaxBytes ? Algorithm::HalvingDoubling
         : hierarchy                                ? Algorithm::Hierarchical
                                                    : Algorithm::Ring;
}

void allreduce(Communicator& comm, std::span<float> data, const AllreduceOptions& options) {
  detail::allreduce_as(comm, data, options, CollectiveKind::Allreduce);
}

namespace detail {

void allreduce_as(Communicator& comm, std::span<float> data, const AllreduceOptions& options,
                  CollectiveKind kind) {
  const CollectiveScope scope(comm, kind_name(kind));
  NativeAllreduce* native = comm.native_allreduce();
  Algorithm algorithm = options.algorithm;
  if (comm.size() > 1) {
    algorithm = algorithm_for(comm, data.size_bytes(), algorithm);
    // Before the call is numbered or the group's abort is read, so that every
    // rank of a group that cannot run it refuses alike (InvalidArgument); and
    // the group is aborted, for a rank whose peers asked for another
    // algorithm, which they would wait on until their timeout.
    try {
      check_algorithm(comm, algorithm);
    } catch (const InvalidArgument& e) {
      refuse_call(comm, e.what());
    }
  }
  Fingerprint fp = start_collective(comm, kind, options.op, DataType::Float32, data.size());
  fp.global_batch = options.global_batch;
  if (comm.size() == 1) {
    finish(data, options.op, 1);
    return;
  }
  fp.algorithm = static_cast<std::uint32_t>(algorithm);  // ranks must agree on it too
  if (algorithm == Algorithm::Ring || algorithm == Algorithm::Hierarchical) {
    // and on the ring's segments, which cut its messages and tags
    fp.segment_bytes = options.ring_segment_bytes != 0 ? options.ring_segment_bytes : kRingSegmentBytes;
  }
  run_collective(comm, fp, [&] {
    if (algorithm == Algorithm::SharedMemory || algorithm == Algorithm::Native) {
      return native->allreduce(data, fp, options.verify);
    }
    if (options.verify) comm.check_fingerprint(fp);
    switch (algorithm) {
      case Algorithm::Naive:
        return naive_allreduce(comm, data, options.op, fp.sequence);
      case Algorithm::HalvingDoubling:
        return halving_doubling_allreduce(comm, data, options.op, fp.sequence);
      case Algorithm::Tree:
        return tree_allreduce(comm, data, options.op, fp.sequence);
      case Algorithm::Hierarchical:
        return hierarchical_allreduce(comm, data, options.op, fp.sequence, options.ring_segment_bytes);
      default:
        return ring_allreduce(comm, data, options.op, fp.sequence, options.ring_segment_bytes);
    }
  });
}

namespace {

// Max or Min of x and y in any order (Note [Max and Min in any order]):
// `y_beyond` is whether y is strictly past x (y > x for Max), `negative_zero_wins`
// whether -0 beats +0 (Min).
inline float nan_first(float x, float y, bool y_beyond, bool negative_zero_wins) {
  const bool x_nan = std::isnan(x), y_nan = std::isnan(y);
  if (x_nan || y_nan) {
    if (!x_nan) return y;
    if (!y_nan) return x;
    return std::bit_cast<std::uint32_t>(y) > std::bit_cast<std::uint32_t>(x) ? y : x;
  }
  if (y_beyond) return y;
  if (y == x && std::signbit(y) == negative_zero_wins) return y;  // -0 and +0
  return x;
}

}  // namespace

void reduce_into(std::span<float> acc, std::span<const float> in, ReduceOp op) {
  LOCKSTEP_CHECK(acc.size() == in.size(), "reduce_into needs equal sizes");
  float* a = acc.data();
  const float* b = in.data();
  const std::size_t n = acc.size();
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
      return;
    // Note [Max and Min in any order]: std::max(a, b) keeps a when a and b
    // are unordered (a NaN) or equal (-0 and +0), so its result would depend
    // on which rank's value the algorithm holds as `a`: ranks, and
    // algorithms, could end with different bits. These are commutative and
    // associative on every float: a NaN wins (of two NaNs, the one with the
    // larger bit pattern), and +0 counts as larger than -0.
    case ReduceOp::Max:
      for (std::size_t i = 0; i < n; ++i) a[i] = nan_first(a[i], b[i], std::isgreater(b[i], a[i]), false);
      return;
    case ReduceOp::Min:
      for (std::size_t i = 0; i < n; ++i) a[i] = nan_first(a[i], b[i], std::isless(b[i], a[i]), true);
      return;
  }
}

void finish(std::span<float> data, ReduceOp op, int world_size) {
  if (op != ReduceOp::Mean || world_size == 1) return;
  const float scale = 1.0f / static_cast<float>(world_size);
  for (float& x : data) x *= scale;
}

}  // namespace detail
}  // namespace lockstep::comm
