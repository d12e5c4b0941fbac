// Note [Synchronised buffers]: with --bn-stats sync every replica applies
// the replicas' updates of the buffers (batch norm's running statistics),
// each weighted by its samples: sum(update_r x b_r) / B, as SyncBatchNorm
// updates them once from the whole batch. The running mean's update is then
// momentum x (the whole batch's mean - running mean) exactly, and
// num_batches_tracked grows by 1 a step. In an epoch's ragged last step a
// replica may have fewer samples, or none (fewer samples than replicas): a
// plain mean of the updates counted it as a whole batch (13 samples on 8
// replicas x 1, two epochs: num_batches_tracked 3.25 after 4 steps). With
// equal shards, the weighted mean is the plain mean, which is taken as before
// (ReduceOp::Mean: the same bits).
//
// The counters are not weighted: they count forwards. With --accumulate K a
// replica with fewer than K samples in a ragged step runs empty micro-steps,
// which count nothing, and the weighted mean of the replicas' counts came to
// less than the K forwards a batch norm synchronised at every forward (as
// PyTorch's SyncBatchNorm is) makes: 2 x 2 x K = 2 on 11 samples gave 3.67
// after 2 steps, not 4. So in a ragged step each counter grows by the
// micro-steps that have a sample on some replica, which every replica
// computes from the sampler alone (micro_steps_with_samples). Under
// --deterministic the step's atoms make the update and the counters grow by
// 1 a step whatever --accumulate, so that runs of one global batch agree bit
// for bit however it is cut (replicas x micro-batch x K); there are no
// micro-steps to count.
#include "synced_buffers.h"

#include <string_view>

namespace lockstep::train::detail {

std::vector<std::size_t> counter_offsets(const nn::Layout& buffers) {
  std::vector<std::size_t> at;
  for (const auto& t : buffers.tensors()) {
    if (std::string_view(t.name).ends_with("num_batches_tracked")) at.push_back(t.offset);
  }
  return at;
}

std::int64_t micro_steps_with_samples(const ddp::DistributedSampler& sampler, std::int64_t step_in_epoch,
                                      int world_size, std::int64_t accumulate, bool pad) {
  const std::int64_t largest = (sampler.shard(step_in_epoch, 0).global_count + world_size - 1) / world_size;
  std::int64_t with_samples = 0;
  for (std::int64_t k = 0; k < accumulate; ++k) {
    for (int r = 0; r < world_size; ++r) {
      const std::int64_t b = sampler.shard(step_in_epoch, r).size(), rows = pad ? largest : b;
      if (rows * k / accumulate < b && rows * (k + 1) / accumulate > rows * k / accumulate) {
        ++with_samples;
        break;
      }
    }
  }
  return with_samples;
}

}  // namespace lockstep::train::detail
