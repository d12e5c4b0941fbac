// Collective operations, written once over the Communicator interface.
//
// Every rank of the group must make the same sequence of collective calls with
// the same counts, ops and roots. All ranks end an all-reduce with bitwise
// identical results.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "lockstep/comm/bf16.h"  // allreduce_bf16 takes its storage
#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

enum class Algorithm {
  Auto,             // chosen by size and world size (see docs/algorithms.md)
  Ring,             // reduce-scatter + all-gather; ~2P(N-1)/N bytes sent per rank
  HalvingDoubling,  // recursive halving + doubling, any N; 2 log2 N rounds
  Naive,            // gather to rank 0, reduce, broadcast; the reference
  SharedMemory,     // the backend's native shared-memory path (threads backend only)
  Native,           // the transport library's own all-reduce (Gloo's, MPI_Allreduce), for comparison
  Tree,             // halving from the nearest partner out: one balanced tree over ranks, the same bits as
                    // one rank summing in order (bit-exact training); powers of two only
  Hierarchical,     // ring inside each node, ring across nodes; needs Communicator::nodes()
};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::Sum;
  Algorithm algorithm = Algorithm::Auto;
  // Check the call's fingerprint against every rank's (docs/algorithms.md
  // gives its cost). false exists to measure that cost: mismatched calls then
  // go undetected until a timeout or give wrong results (the shared-memory
  // path still compares element counts, since it reads other ranks' buffers,
  // and whole fingerprints where any rank verifies, so that all ranks fail
  // together).
  bool verify = true;
  // The ring sends each chunk in segments of at most this many bytes, so that
  // one is on the wire while the one before it is reduced; 0 is the default,
  // 4 MiB (measured across shaped links: docs/results.md). Every rank must
  // pass the same value (message sizes differ otherwise, and the group aborts).
  std::size_t ring_segment_bytes = 0;
  // The step's global sample count, where the data was weighted by it (the
  // reducer, average_gradients). Checked with the fingerprint: a rank that
  // passes another count fails the call on every rank, naming both. 0 checks
  // nothing more.
  std::uint64_t global_batch = 0;
};

const char* to_string(ReduceOp op);
const char* to_string(Algorithm algorithm);
// The inverse of to_string; throws InvalidArgument naming the choices.
Algorithm algorithm_from_string(std::string_view name);

// Throws InvalidArgument when `algorithm` cannot run on `comm`, as allreduce
// would at its first call: shared_memory needs the threads backend, native a
// transport library's, tree a power-of-two group, hierarchical a node layout
// (Communicator::nodes()). A group of one runs any. The reducer checks its
// algorithm with this when it is built.
void check_algorithm(Communicator& comm, Algorithm algorithm);

// The algorithm allreduce runs on `comm` for `bytes` of data when asked for
// `requested`: Auto by the rule of docs/algorithms.md (the backend's
// shared-memory path where it shares memory; else halving-doubling below
// 64 KiB, hierarchical on several nodes of equal size, the ring), any other
// as given. The same on every rank of a group.
Algorithm algorithm_for(Communicator& comm, std::size_t bytes, Algorithm requested);

// In place: on return every rank's `data` holds op(data of all ranks).
void allreduce(Communicator& comm, std::span<float> data, const AllreduceOptions& options = {});

// allreduce with bfloat16 on the wire (bf16.h): half the bytes of the float
// ring. In place: on return every rank's `data` holds op(data of all ranks),
// rounded to bf16, bitwise identical on every rank. `op` must be Sum or Mean;
// Max and Min throw InvalidArgument (and abort the group). Always the ring:
// partial sums are added in float and rounded to bf16 only to be sent on, so
// a result carries N-1 roundings to bf16 (error bound: ring_allreduce_bf16.cpp).
// Ring: 2(N-1) rounds; bytes sent per rank 2(N-1)/N x 2 x count, half the
// float ring's 2(N-1)/N x 4 x count.
// `global_batch`: as AllreduceOptions::global_batch.
void allreduce_bf16(Communicator& comm, std::span<std::uint16_t> data, ReduceOp op, std::uint64_t global_batch = 0);

// `in` (the same count on every rank) is cut into N chunks as evenly as
// possible (chunk i = [i*count/N, (i+1)*count/N)); rank r receives in `out`
// chunk r of op(in of all ranks). out.size() must equal chunk r's size.
// Ring: N-1 rounds, P(N-1)/N bytes sent per rank.
void reduce_scatter(Communicator& comm, std::span<const float> in, std::span<float> out, ReduceOp op);

// Every rank contributes `in` (the same size on every rank); `out`
// (N x in.size()) receives rank i's `in` at offset i x in.size(), on every
// rank. Ring: N-1 rounds, (N-1) x in bytes sent per rank.
void all_gather(Communicator& comm, std::span<const float> in, std::span<float> out);

// Every rank contributes `in` (the same size on every rank); the root's
// `out` (N x in.size()) receives rank i's `in` at offset i x in.size(). The
// others' `out` is not used (it may be empty). One round: in bytes sent by
// each rank but the root.
void gather(Communicator& comm, std::span<const float> in, std::span<float> out, int root);

// The mirror: the root's `in` (N x out.size()) holds every rank's block,
// and rank i's `out` receives block i. The others' `in` is not used (it may
// be empty). One round: out bytes sent by the root to each other rank.
void scatter(Communicator& comm, std::span<const float> in, std::span<float> out, int root);

// The two halves of the all-reduce, in place, for sharded training (ZeRO-1,
// docs/design.md). `data` (the same count on every rank) is cut into N chunks
// as the ring cuts it (chunk i = [i*count/N, (i+1)*count/N)), and rank r owns
// chunk shard_chunk(r, N) = (r+1) mod N: the chunk the ring's reduce-scatter
// completes there. Both run the shared-memory path where the backend shares
// memory (Algorithm Auto or SharedMemory) and the ring otherwise (Auto or
// Ring); any other algorithm is InvalidArgument, on every rank.
// InvalidArgument unless 0 <= rank < world_size.
int shard_chunk(int rank, int world_size);
// [begin, end) of rank's chunk of `count` elements.
std::pair<std::size_t, std::size_t> shard_range(std::size_t count, int rank, int world_size);
// On return rank r's own chunk holds op over every rank's chunk (Mean: / N),
// the same bits the same algorithm's all-reduce gives; the rest of `data`
// is left in an unspecified state. Ring: N-1 rounds, P(N-1)/N bytes sent.
// `options.global_batch` and `verify` as for allreduce.
void reduce_scatter_in_place(Communicator& comm, std::span<float> data, const AllreduceOptions& options = {});
// On entry each rank's own chunk is what it contributes; on return every
// chunk of every rank's `data` holds its owner's. Ring: N-1 rounds,
// P(N-1)/N bytes sent. options.op and global_batch are not used.
void all_gather_in_place(Communicator& comm, std::span<float> data, const AllreduceOptions& options = {});

// In place: on return every rank's `data` holds root's `data`.
void broadcast(Communicator& comm, std::span<std::byte> data, int root);
inline void broadcast(Communicator& comm, std::span<float> data, int root) {
  broadcast(comm, std::as_writable_bytes(data), root);
}

// Returns once every rank has entered the barrier.
void barrier(Communicator& comm);

}  // namespace lockstep::comm
