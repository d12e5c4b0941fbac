// The threads backend's barrier.
//
// Arrival is one atomic increment; the last rank to arrive resets the counter,
// bumps the generation and wakes the sleepers. Waiters first yield the core a
// few hundred times (cheap when ranks outnumber cores: the yield runs a rank
// that still has work), then sleep on the generation with a futex, whose
// timeout bounds the wait. The counter is reset before the generation moves,
// so a rank that has seen the new generation can arrive at the next barrier
// at once.
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

#include "lockstep/error.h"
#include "threads_hub.h"

namespace lockstep::comm::detail {
namespace {

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

void Hub::wake_barrier() { futex_wake_all(barrier_generation); }

void Hub::barrier(int rank, Duration timeout, const Fingerprint& fp) {
  auto aborted_error = [&] {
    std::lock_guard lock(mu);
    return CommAborted("rank " + std::to_string(rank) + ": communicator aborted: " + abort_reason);
  };
  if (aborted_flag.load()) throw aborted_error();
  const std::uint32_t generation = barrier_generation.load(std::memory_order_acquire);
  if (barrier_arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(size())) {
    barrier_arrived.store(0, std::memory_order_relaxed);
    barrier_generation.fetch_add(1, std::memory_order_release);
    futex_wake_all(barrier_generation);
    return;
  }
  for (int spin = 0; spin < 200; ++spin) {
    if (barrier_generation.load(std::memory_order_acquire) != generation) return;
    sched_yield();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (barrier_generation.load(std::memory_order_acquire) == generation) {
    if (aborted_flag.load()) throw aborted_error();
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) {
      const std::string msg = "rank " + std::to_string(rank) + ": " + describe(fp) + " timed out after " +
                              std::to_string(timeout.count()) + " ms waiting for " +
                              std::to_string(size() - static_cast<int>(barrier_arrived.load())) +
                              " other rank(s)";
      {
        std::lock_guard lock(mu);
        abort_locked(msg);
      }
      throw TimeoutError(msg);
    }
    futex_wait(barrier_generation, generation, left);
  }
}

void publish_and_check(Hub& hub, int rank, const Fingerprint& fp, bool verify, Duration timeout) {
  auto& board = hub.fingerprints[fp.sequence % 2];
  board[rank] = fp;
  hub.barrier(rank, timeout, fp);
  if (!verify) return;
  for (int j = 0; j < hub.size(); ++j) {
    if (board[j] == fp) continue;
    const std::string msg = "collective mismatch: rank " + std::to_string(rank) + " called " + describe(fp) +
                            " but rank " + std::to_string(j) + " called " + describe(board[j]);
    {
      std::lock_guard lock(hub.mu);
      hub.abort_locked(msg);
    }
    throw CommAborted(msg);
  }
}

}  // namespace lockstep::comm::detail
