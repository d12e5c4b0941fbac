// The reducer: gradient buckets whose all-reduce overlaps with backward.
//
// The reducer sees one contiguous span of gradients cut into tensors, and
// "tensor i is ready" events. It never sees layers. Backward produces
// gradients last tensor first, so buckets are filled in reverse tensor order
// (Note [Bucket assignment] in reducer.cpp) and each is a contiguous range of
// the gradient span: the gradients live in bucket memory and are reduced in
// place, with no copy.
//
// A step:
//   begin_step(local, global)     the sample counts, for ragged weighting
//   mark_ready(t) for every t     from backward, in any order; when the last
//                                 tensor of bucket k is ready, bucket k is
//                                 queued to the communication thread, which
//                                 all-reduces buckets strictly in order 0, 1, ...
//   finish_step()                 waits for what is still in flight
// On return every replica holds the mean gradient over all `global` samples
// (the contract of ddp::average_gradients, which is the reducer's naive
// sibling: one all-reduce after backward). `global` must be the same on every
// replica, the sum of the `local` counts. The first is checked: each bucket's
// fingerprint carries `global` (comm::AllreduceOptions::global_batch), so a replica
// given another count fails the step on every replica with CommAborted naming
// both. The sum is the caller's to keep (the sampler's shards keep it).
//
// Gradient accumulation (K micro-steps, one all-reduce): call begin_step once
// with the counts of all K micro-batches, run the K forward and backward
// passes adding into the gradient span, call mark_ready only during the last
// backward, then finish_step; the buckets carry the sum of the K gradients
// (the trainer's loop in src/train/replica.cpp does this). Marking a tensor
// in an earlier micro-step would launch its bucket before the rest is added.
//
// Misuse (a call out of order, a tensor index out of range or marked twice,
// counts out of range) throws InvalidArgument.
//
// Threading: the owning thread calls every method. The communication thread
// (options.overlap)
// is the only user of the communicator between begin_step() and the return
// of finish_step(); outside a step the owner may use it freely. A bucket's
// memory belongs to the communication thread from its last mark_ready until
// finish_step() returns.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/comm/collectives.h"

namespace lockstep::ddp {

struct Bucket {
  std::size_t offset = 0;            // first float in the gradient span
  std::size_t numel = 0;             // floats
  std::vector<std::size_t> tensors;  // tensor indices, in fill (reverse) order
  std::size_t bytes() const { return numel * sizeof(float); }
};

// Note [Bucket assignment]: a pure function of the tensor sizes and the caps,
// so every replica computes the same buckets without talking. Tensors are
// taken last to first; a tensor joins the open bucket, and the bucket closes
// once it holds at least its cap (the first bucket's cap is
// `first_bucket_bytes`, every later one's `bucket_bytes`). A tensor larger
// than the cap therefore closes its bucket at once. `bucket_bytes` == 0 means
// one bucket for everything (no overlap). Buckets are returned in launch order.
std::vector<Bucket> assign_buckets(std::span<const std::size_t> tensor_numels, std::size_t first_bucket_bytes,
                                   std::size_t bucket_bytes);

// One line per bucket: "bucket 0: 1.00 MiB, tensors 3.bias 3.weight".
std::string describe_buckets(const std::vector<Bucket>& buckets, std::span<const std::string> tensor_names);

enum class Compression {
  None,
  Bf16,  // bf16 on the wire (half the bytes), with error feedback
};

struct ReducerOptions {
  double first_bucket_mb = 1;  // MiB; the first bucket launched (the last tensors)
  double bucket_mb = 25;       // MiB; 0 = a single bucket at the end of backward
  comm::Algorithm algorithm = comm::Algorithm::Auto;
  // Bf16 all-reduces with its own ring (bf16 on the wire, float32 sums), so
  // it takes algorithm Auto or Ring only; any other is InvalidArgument.
  Compression compression = Compression::None;
  // true: a communication thread all-reduces each bucket as soon as it is
  // ready, overlapping backward. false: finish_step() all-reduces the
  // buckets in order on the caller's thread (same results, same bytes; for
  // transports whose "communication" is work on the same cores as compute,
  // where a second thread only takes slices from backward).
  bool overlap = true;
  // ZeRO-1 (docs/design.md, "Sharded optimizer state"): each bucket is
  // reduce-scattered in place instead of all-reduced
  // (comm::reduce_scatter_in_place), so after finish_step() this rank holds
  // the mean only in its own chunk of every bucket (owned_ranges()); the
  // rest of the span is left in an unspecified state. After the optimizer
  // has updated those ranges, gather() all-gathers the weights bucket by
  // bucket. Together the bytes of one all-reduce. Compression must be None,
  // and the algorithm Auto, Ring or SharedMemory (InvalidArgument otherwise).
  bool shard = false;
};

// A run of floats [offset, offset + numel) of the gradient span.
struct GradRange {
  std::size_t offset = 0, numel = 0;
};

// Rank `rank`'s chunk of every bucket (comm::shard_range), in increasing
// offset order, empty chunks left out: what a sharded reducer leaves reduced
// there. A pure function, like the buckets.
std::vector<GradRange> owned_ranges(const std::vector<Bucket>& buckets, int rank, int world_size);

// When bucket k's all-reduce happened in the last step.
struct BucketTiming {
  std::chrono::steady_clock::time_point ready, start, end;
  std::uint64_t bytes_sent = 0;     // as counted by the communicator (CommStats)
  std::uint64_t messages_sent = 0;  // 0 on a path that sends none (the threads backend's shared memory)
};

struct StepTiming {
  std::vector<BucketTiming> buckets;                           // in launch order
  std::chrono::steady_clock::time_point wait_start, wait_end;  // finish_step's wait
};

class Reducer {
 public:
  // `grads` must outlive the reducer. Checks at once that every rank computed
  // the same buckets (a collective: all ranks construct their reducers
  // together); throws InvalidArgument on every rank if not.
  Reducer(comm::Communicator& comm, std::span<float> grads, std::span<const std::size_t> tensor_numels,
          const ReducerOptions& options = {});
  // Joins the communication thread. Destroyed in the middle of a step (an
  // error unwinding), it aborts the group so that no rank waits forever.
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  const std::vector<Bucket>& buckets() const;

  void begin_step(std::int64_t local_count, std::int64_t global_count);
  void mark_ready(std::size_t tensor);
  // Rethrows the communication thread's error, if any (the group is then aborted).
  const StepTiming& finish_step();
  // For sharded training (options.shard): all-gathers `params`, laid out
  // like the gradients, bucket by bucket in launch order, so that every
  // rank's holds each owner's ranges (owned_ranges()). Between steps only,
  // on the owner's thread.
  void gather(std::span<float> params);
  // The step's gradients were not applied (every replica skipped it): with
  // bf16 compression, forgets the rounding error kept for the next step
  // (Note [Error feedback]), which came from them. Between steps only.
  void discard_error_feedback();
  // With bf16 compression, the rounding error this rank carries to the next
  // step (Note [Error feedback]), laid out like the gradients; empty without.
  // For checkpoints: restore_error_feedback() puts a saved one back
  // (InvalidArgument unless it is error_feedback().size() long). Between
  // steps only.
  std::span<const float> error_feedback() const;
  void restore_error_feedback(std::span<const float> error);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::ddp
