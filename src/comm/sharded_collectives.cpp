// The all-reduce's two halves as collectives of their own, in place, for
// sharded training (ZeRO-1: each rank updates only the chunk it owns).
//
//   reduce_scatter_in_place: after it, rank r's chunk (r+1) mod N holds the
//     reduction over all ranks. Ring: rounds 0 .. N-2 of the ring all-reduce
//     (ring_allreduce.cpp), N-1 rounds, P(N-1)/N bytes sent per rank.
//     Shared memory: rank r reads its chunk of all N buffers once and writes
//     the result into its own buffer only (shared_memory_allreduce.cpp).
//   all_gather_in_place: after it, every rank's buffer holds every owner's
//     chunk. Ring: rounds N-1 .. 2N-3, N-1 rounds, P(N-1)/N bytes sent per
//     rank. Shared memory: rank r copies its chunk into the N-1 other buffers.
//
// Together: the bytes, rounds and sums of one all-reduce, so a sharded step
// communicates what a replicated one does (2P(N-1)/N), and its reduced chunks
// are the same bits as that algorithm's all-reduce gives.

#include "algorithms.h"
#include "fingerprint.h"
#include "lockstep/error.h"

namespace lockstep::comm {

int shard_chunk(int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InvalidArgument("shard of rank " + std::to_string(rank) + " in a group of " + std::to_string(world_size) +
                          ": the group needs at least 1 rank and the rank must be in [0, world size)");
  }
  return (rank + 1) % world_size;
}

std::pair<std::size_t, std::size_t> shard_range(std::size_t count, int rank, int world_size) {
  const int c = shard_chunk(rank, world_size);
  return {detail::chunk_begin(count, world_size, c), detail::chunk_begin(count, world_size, c + 1)};
}

void NativeAllreduce::reduce_scatter(std::span<float>, const Fingerprint&, bool) {
  throw InvalidArgument("this backend has no native reduce-scatter; use the ring");
}

void NativeAllreduce::all_gather(std::span<float>, const Fingerprint&, bool) {
  throw InvalidArgument("this backend has no native all-gather; use the ring");
}

namespace {

// One half: `reduce` is true for the reduce-scatter.
void sharded_half(Communicator& comm, std::span<float> data, const AllreduceOptions& options, bool reduce) {
  const CollectiveKind kind = reduce ? CollectiveKind::ReduceScatter : CollectiveKind::AllGather;
  const ReduceOp op = reduce ? options.op : ReduceOp::Sum;
  const detail::CollectiveScope scope(comm, reduce ? "reduce_scatter_in_place" : "all_gather_in_place");
  Fingerprint fp = detail::start_collective(comm, kind, op, DataType::Float32, data.size());
  fp.global_batch = options.global_batch;
  const int n = comm.size();
  if (n == 1) {
    if (reduce) detail::finish(data, op, 1);
    return;
  }
  NativeAllreduce* native = comm.native_allreduce();
  const bool shared = native != nullptr && native->shares_memory();
  Algorithm algorithm = options.algorithm;
  if (algorithm == Algorithm::Auto) algorithm = shared ? Algorithm::SharedMemory : Algorithm::Ring;
  fp.algorithm = static_cast<std::uint32_t>(algorithm);
  if (algorithm == Algorithm::Ring) {
    fp.segment_bytes =
        options.ring_segment_bytes != 0 ? options.ring_segment_bytes : detail::kRingSegmentBytes;
  }
  detail::run_collective(comm, fp, [&] {
    if (algorithm != Algorithm::Ring && algorithm != Algorithm::SharedMemory) {
      throw InvalidArgument(
          std::string("a sharded step reduce-scatters and all-gathers with the ring or shared "
                      "memory, not ") +
          to_string(algorithm) + "; use algorithm auto or ring");
    }
    if (algorithm == Algorithm::SharedMemory) {
      if (!shared) throw InvalidArgument("the shared_memory reduce-scatter needs the threads backend");
      return reduce ? native->reduce_scatter(data, fp, options.verify)
                    : native->all_gather(data, fp, options.verify);
    }
    if (options.verify) comm.check_fingerprint(fp);
    // Rounds 0 .. N-2 of the ring all-reduce, or N-1 .. 2N-3.
    if (reduce) return detail::ring_rounds(comm, data, op, fp.sequence, options.ring_segment_bytes, 0, n - 1, n);
    detail::ring_rounds(comm, data, op, fp.sequence, options.ring_segment_bytes, n - 1, 2 * (n - 1), 0);
  });
}

}  // namespace

void reduce_scatter_in_place(Communicator& comm, std::span<float> data, const AllreduceOptions& options) {
  sharded_half(comm, data, options, true);
}

void all_gather_in_place(Communicator& comm, std::span<float> data, const AllreduceOptions& options) {
  sharded_half(comm, data, options, false);
}

}  // namespace lockstep::comm
