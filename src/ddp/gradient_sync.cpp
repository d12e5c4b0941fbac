#include "lockstep/ddp/gradient_sync.h"

#include "lockstep/error.h"

namespace lockstep::ddp {

void average_gradients(comm::Communicator& comm, std::span<float> grads, std::int64_t local_count,
                       std::int64_t global_count, comm::Algorithm algorithm) {
  LOCKSTEP_REQUIRE(global_count > 0 && local_count >= 0 && local_count <= global_count,
                   "average_gradients: the local sample count " + std::to_string(local_count) +
                       " must be in [0, global count] and the global count " + std::to_string(global_count) +
                       " positive");
  const std::int64_t n = comm.size();
  if (local_count * n != global_count) {  // ragged: weight by sample count
    const float w = static_cast<float>(static_cast<double>(n * local_count) / double(global_count));
    for (float& g : grads) g *= w;
  }
  comm::allreduce(comm, grads, {.op = comm::ReduceOp::Mean, .algorithm = algorithm});
}

}  // namespace lockstep::ddp
