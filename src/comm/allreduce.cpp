// Front door of all-reduce: argument checks, algorithm choice, shared kernels.
#include <algorithm>

#include "algorithms.h"
#include "lockstep/error.h"

namespace lockstep::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

const char* to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::Auto: return "auto";
    case Algorithm::Ring: return "ring";
    case Algorithm::Naive: return "naive";
    case Algorithm::SharedMemory: return "shared_memory";
  }
  return "?";
}

void allreduce(Communicator& comm, std::span<float> data, const AllreduceOptions& options) {
  if (comm.size() == 1) {
    detail::finish(data, options.op, 1);
    return;
  }
  switch (options.algorithm) {
    case Algorithm::Naive:
      detail::naive_allreduce(comm, data, options.op);
      return;
    case Algorithm::SharedMemory:
      if (auto* native = comm.native_allreduce()) {
        native->allreduce(data, options.op);
        return;
      }
      throw InvalidArgument("the shared_memory all-reduce needs the threads backend");
    case Algorithm::Auto:
      // Where the backend shares memory, its native path moves the least
      // memory and synchronises twice instead of 2(N-1) times
      // (docs/algorithms.md). Otherwise the ring, which is bandwidth-optimal.
      if (auto* native = comm.native_allreduce()) {
        native->allreduce(data, options.op);
        return;
      }
      detail::ring_allreduce(comm, data, options.op);
      return;
    case Algorithm::Ring:
      detail::ring_allreduce(comm, data, options.op);
      return;
  }
}

namespace detail {

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
    case ReduceOp::Max:
      for (std::size_t i = 0; i < n; ++i) a[i] = std::max(a[i], b[i]);
      return;
    case ReduceOp::Min:
      for (std::size_t i = 0; i < n; ++i) a[i] = std::min(a[i], b[i]);
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
