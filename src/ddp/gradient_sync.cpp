#include "lockstep/ddp/gradient_sync.h"

#include "lockstep/error.h"
#include "ragged_weight.h"

namespace lockstep::ddp {

void average_gradients(comm::Communicator& comm, std::span<float> grads, std::int64_t local_count,
                       std::int64_t global_count, comm::Algorithm algorithm) {
  if (!(global_count > 0 && local_count >= 0 && local_count <= global_count)) {
    comm::refuse_call(comm, "average_gradients: the local sample count " + std::to_string(local_count) +
                                " must be in [0, global count] and the global count " +
                                std::to_string(global_count) + " positive");
  }
  const std::int64_t n = comm.size();
  if (const float w = detail::ragged_weight(local_count, n, global_count); w != 1.0f) {  // ragged
    for (float& g : grads) g *= w;
  }
  // Every rank must weight by the same global count: the fingerprint checks it.
  comm::allreduce(comm, grads,
                  {.op = comm::ReduceOp::Mean, .algorithm = algorithm, .global_batch = std::uint64_t(global_count)});
}

}  // namespace lockstep::ddp
