// Private to the threads backend: the state its ranks share.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.h"

namespace lockstep::comm::detail {

enum class OpState { kParked, kCopying, kDone };

struct Op {
  int src = 0;
  int dst = 0;
  std::uint64_t tag = 0;
  bool is_send = false;
  const std::byte* send_data = nullptr;  // set for sends
  std::byte* recv_data = nullptr;        // set for receives
  std::size_t bytes = 0;
  OpState state = OpState::kParked;  // guarded by Hub::mu
};

struct Hub {
  explicit Hub(int n)
      : cv(n),
        parked_sends(n),
        parked_recvs(n),
        barriers_entered(std::make_unique<std::atomic<std::uint64_t>[]>(n)),
        slots(n),
        staging{std::vector<std::vector<float>>(n), std::vector<std::vector<float>>(n)},
        tree_scratch(n),
        fingerprints{std::vector<Fingerprint>(n), std::vector<Fingerprint>(n)},
        verify_asked{std::vector<char>(n), std::vector<char>(n)} {}
  int size() const { return static_cast<int>(cv.size()); }
  std::mutex mu;
  std::vector<std::condition_variable> cv;  // cv[r]: rank r waits on it
  // By destination rank. Guarded by mu.
  std::vector<std::deque<std::shared_ptr<Op>>> parked_sends;
  std::vector<std::deque<std::shared_ptr<Op>>> parked_recvs;
  bool aborted = false;      // guarded by mu
  std::string abort_reason;  // guarded by mu

  // Barrier (threads_barrier.cpp): generation << 32 | ranks arrived, in one
  // word so that a rank can withdraw its arrival atomically; and a futex word
  // bumped by every completion and every abort.
  std::atomic<std::uint64_t> barrier_state{0};
  std::atomic<std::uint32_t> wake_epoch{0};
  std::atomic<bool> aborted_flag{false};  // mirrors `aborted` for lock-free readers
  // Per rank, written only by that rank: barriers it has entered (a rank
  // that withdraws still counts: it came, and the group is aborted after it).
  // Every rank enters the same barriers in the same order, so a rank that
  // times out in its k-th names the ranks still short of k.
  std::unique_ptr<std::atomic<std::uint64_t>[]> barriers_entered;

  // Shared-memory collectives: each rank publishes its buffer here between
  // two barriers. slots[r] is written only by rank r, read by all after the
  // first barrier.
  std::vector<float*> slots;
  // Staged copies of small inputs, by sequence parity (shared_memory_allreduce.cpp).
  std::vector<std::vector<float>> staging[2];
  // Per rank, written only by that rank: partial sums of the tree-ordered
  // shared-memory all-reduce.
  std::vector<std::vector<float>> tree_scratch;
  // Fingerprints by sequence parity: a rank can start call s+2 only after
  // every rank has passed a barrier of call s+1, so by then nobody still
  // reads the board of call s.
  std::vector<Fingerprint> fingerprints[2];
  // Beside them, whether each rank asked for the whole fingerprint to be
  // compared (AllreduceOptions::verify); char, not bool: each rank writes its own.
  std::vector<char> verify_asked[2];

  void abort_locked(const std::string& reason) {
    if (aborted) return;
    aborted = true;
    abort_reason = reason.empty() ? "aborted" : reason;
    aborted_flag.store(true);
    for (auto& c : cv) c.notify_all();
    wake_barrier();
  }
  void wake_barrier();

  // Blocks until all ranks have arrived. Interruptible: throws CommAborted
  // if the group is aborted, TimeoutError (and aborts the group) after
  // `timeout`, and in both cases withdraws this rank's arrival first, so the
  // barrier cannot complete without it. Not interruptible: waits for every
  // rank whatever happens; only for ranks that are past an earlier barrier of
  // the same call and cannot block (Note [Nobody leaves while others write]).
  void barrier(int rank, Duration timeout, const Fingerprint& fp, bool interruptible = true);
  // "rank 5 (1 of 8 had not arrived)": the ranks that have not entered the
  // `entered`-th barrier (threads_barrier.cpp).
  std::string missing_ranks(std::uint64_t entered) const;
};

// Publishes `fp`, waits for every rank, and compares all fingerprints;
// throws CommAborted naming both sides on a mismatch (threads_barrier.cpp).
// With verify false on every rank only the element counts are compared.
void publish_and_check(Hub& hub, int rank, const Fingerprint& fp, bool verify, Duration timeout);

// The shared-memory all-reduce (shared_memory_allreduce.cpp); buffers up to
// kStagedMaxBytes take one barrier instead of two.
inline constexpr std::size_t kStagedMaxBytes = std::size_t{16} << 10;
void shared_memory_allreduce(Hub& hub, int rank, std::span<float> data, const Fingerprint& fp, bool verify,
                             Duration timeout);
// Its two halves (comm::reduce_scatter_in_place, comm::all_gather_in_place).
void shared_memory_reduce_scatter(Hub& hub, int rank, std::span<float> data, const Fingerprint& fp, bool verify,
                                  Duration timeout);
void shared_memory_all_gather(Hub& hub, int rank, std::span<float> data, const Fingerprint& fp, bool verify,
                              Duration timeout);

}  // namespace lockstep::comm::detail
