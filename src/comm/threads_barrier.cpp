// The threads backend's barrier.
//
// The state is one 64-bit word, generation << 32 | ranks arrived. Arrival is
// one atomic increment; the last rank to arrive moves the word to
// (generation + 1, 0) with a compare-exchange and wakes the sleepers. Waiters
// first yield the core while the other ranks keep arriving (cheap when ranks
// outnumber cores: the yield runs a rank that still has work), then sleep on a
// futex word that
// every completion and every abort bumps, so neither can be missed between a
// check and the sleep. A rank that gives up (abort, timeout) withdraws its
// arrival with a compare-exchange on the same word: either the barrier had
// already completed, and the rank goes on as a member of it, or it never
// completes without that rank.
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <ctime>
#include <string>
#include <vector>

#include "lockstep/error.h"
#include "threads_hub.h"

namespace lockstep::comm::detail {
namespace {

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr,
          0);
}

}  // namespace

void Hub::wake_barrier() {
  wake_epoch.fetch_add(1, std::memory_order_release);
  futex_wake_all(wake_epoch);
}

std::string Hub::missing_ranks(std::uint64_t entered) const {
  std::vector<int> missing;
  for (int j = 0; j < size(); ++j)
    if (barriers_entered[j].load(std::memory_order_relaxed) < entered) missing.push_back(j);
  if (missing.empty()) return "ranks that arrived as it gave up";  // all came in the last instant
  constexpr std::size_t kNamed = 8;
  std::string s = missing.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < std::min(missing.size(), kNamed); ++i)
    s += (i > 0 ? ", " : "") + std::to_string(missing[i]);
  if (missing.size() > kNamed) s += " and " + std::to_string(missing.size() - kNamed) + " more";
  return s + " (" + std::to_string(missing.size()) + " of " + std::to_string(size()) +
         " had not arrived)";
}

void Hub::barrier(int rank, Duration timeout, const Fingerprint& fp, bool interruptible) {
  auto aborted_error = [&] {
    std::lock_guard lock(mu);
    return CommAborted("rank " + std::to_string(rank) + ": communicator aborted: " + abort_reason);
  };
  if (interruptible && aborted_flag.load()) throw aborted_error();
  const auto n = static_cast<std::uint64_t>(size());
  // Only this rank writes its count: a plain store, no locked instruction.
  const std::uint64_t entered = barriers_entered[rank].load(std::memory_order_relaxed) + 1;
  barriers_entered[rank].store(entered, std::memory_order_relaxed);
  std::uint64_t state = barrier_state.fetch_add(1, std::memory_order_acq_rel) + 1;
  const std::uint64_t generation = state >> 32;
  // The last to arrive completes the barrier, unless someone withdrew meanwhile.
  if ((state & 0xffffffffu) == n &&
      barrier_state.compare_exchange_strong(state, (generation + 1) << 32, std::memory_order_acq_rel)) {
    wake_barrier();
    return;
  }
  auto completed = [&] { return (barrier_state.load(std::memory_order_acquire) >> 32) != generation; };
  // Note [Yield while they arrive]: yielding pays when the others are about
  // to arrive (every replica reaching the same all-reduce at the end of its
  // step). When they are still computing (a reducer's bucket launched in the
  // middle of backward), each yield only steals a slice from their compute,
  // so stop after kPatience yields without a new arrival and sleep instead.
  constexpr int kMaxYields = 200, kPatience = 8;
  std::uint64_t seen = state;
  for (int spin = 0, idle = 0; spin < kMaxYields && idle < kPatience; ++spin) {
    if (completed()) return;
    sched_yield();
    const std::uint64_t now = barrier_state.load(std::memory_order_acquire);
    idle = now == seen ? idle + 1 : 0;
    seen = now;
  }
  const auto deadline = deadline_after(timeout);
  for (;;) {
    const std::uint32_t epoch = wake_epoch.load(std::memory_order_acquire);
    if (completed()) return;
    const auto left = deadline - std::chrono::steady_clock::now();
    const bool timed_out = left <= std::chrono::nanoseconds::zero();
    if (interruptible && (timed_out || aborted_flag.load())) {
      // Withdraw, unless the barrier completed meanwhile: then we are in it.
      std::uint64_t cur = barrier_state.load(std::memory_order_acquire);
      while ((cur >> 32) == generation) {
        if (!barrier_state.compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel)) continue;
        if (!timed_out) throw aborted_error();
        const std::string msg = "rank " + std::to_string(rank) + ": " + describe(fp) + " timed out after " +
                                std::to_string(timeout.count()) + " ms waiting for " +
                                missing_ranks(entered);
        {
          std::lock_guard lock(mu);
          abort_locked(msg);
        }
        throw TimeoutError(msg);
      }
      return;
    }
    // Sleep until a completion or an abort bumps the epoch (or 100 ms pass,
    // for a barrier that may not be interrupted).
    const auto nap = timed_out ? std::chrono::nanoseconds(std::chrono::milliseconds(100))
                               : std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(100));
    futex_wait(wake_epoch, epoch, nap);
  }
}

void publish_and_check(Hub& hub, int rank, const Fingerprint& fp, bool verify, Duration timeout) {
  auto& board = hub.fingerprints[fp.sequence % 2];
  auto& asked = hub.verify_asked[fp.sequence % 2];
  board[rank] = fp;
  asked[rank] = verify ? 1 : 0;
  hub.barrier(rank, timeout, fp);
  // Note [One verdict on every rank]: the shared-memory path's second barrier
  // waits for every rank, so either every rank throws here or none does.
  // Hence the whole fingerprint is compared when any rank asked for it (a
  // rank with verify false that went on past a mismatch the others threw on
  // wrote into their buffers and then waited for them for good). Without
  // verify anywhere only the element counts are compared: each rank reads
  // and writes every other rank's buffer, so a shorter one would be overrun.
  const bool full = std::find(asked.begin(), asked.end(), 1) != asked.end();
  for (int j = 0; j < hub.size(); ++j) {
    if (full ? board[j] == fp : board[j].count == fp.count) continue;
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
