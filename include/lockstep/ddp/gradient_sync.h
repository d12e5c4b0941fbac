// Gradient synchronisation: the one all-reduce per step.
//
// Every replica passes its local gradient, the mean over its own `local_count`
// samples. On return every replica holds the same gradient: the mean over all
// `global_count` samples of the step. With equal shards this is the plain
// mean of the replicas' gradients. With ragged shards each replica's gradient
// is first weighted by N * local_count / global_count, so the result is still
// the exact mean over all samples rather than a mean of means that would
// over-weight the short shard.
//
// `global_count` must be the same on every replica (the all-reduce's
// fingerprint checks it: a replica given another fails the call on every
// replica, naming both) and the sum of the local counts (the caller's to
// keep). Counts out of range fail the call on every replica too.
//
// ddp::Reducer keeps this contract with buckets overlapped with backward;
// this is its naive sibling.
#pragma once

#include <cstdint>
#include <span>

#include "lockstep/comm/collectives.h"

namespace lockstep::ddp {

void average_gradients(comm::Communicator& comm, std::span<float> grads, std::int64_t local_count,
                       std::int64_t global_count, comm::Algorithm algorithm = comm::Algorithm::Auto);

}  // namespace lockstep::ddp
