// Private: the Communicator over Gloo's TCP pairs (connect_gloo in
// include/lockstep/comm/process_group.h builds one).
//
// isend/irecv: one gloo::transport::UnboundBuffer per transfer, sent to or
// received from the peer's pair on slot = our tag (messages between one pair
// on one slot match in order, as communicator.h promises). Work::wait is
// Gloo's timed wait.
//
// Failure (Note [Failure in a process group]):
//   - a timed-out wait: TimeoutError naming this rank, the peer and the
//     collective's sequence number; the group is aborted.
//   - a broken connection (the peer died, or aborted and closed it): the
//     store's abort reason if a rank recorded one, else CommAborted naming
//     the peer as the one that failed; the group is aborted.
//   - abort(reason): records the reason in the store (first writer wins),
//     wakes this rank's waiters and closes every connection
//     (Note [Closing the mesh]), so every peer fails at once and reads why.
//   - Note [Watching for aborts]: closing connections wakes a peer only if it
//     waits on one of them. A rank waiting on the dead rank alone (a send
//     that waits for the dead peer's ready-to-receive; Gloo does not fail it
//     when that pair breaks) would sleep to its timeout. So while transfers
//     are pending, a watcher thread reads the store's abort reason every
//     kWatchPeriod, over its own connection to the store, and wakes them.
// Every later call fails at once with CommAborted.
//
// Thread-safety: as communicator.h; in addition abort(), abort_reason() and
// stats() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "lockstep/comm/process_group.h"
#include "mesh.h"
#include "store.h"

namespace lockstep::comm::gloo_backend {

// Gloo's own waits add their timeout to the clock in nanoseconds: connect
// refuses longer timeouts, and waits after it (set_timeout and wait() take
// any Duration) are held to this.
inline constexpr Duration kMaxTimeout{std::chrono::hours(24 * 30)};

class GlooWork;

class GlooCommunicator final : public Communicator, private NativeAllreduce {
 public:
  GlooCommunicator(std::unique_ptr<RendezvousStore> store, std::shared_ptr<Mesh> mesh);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<Work> post_send(int peer, std::uint64_t tag, std::span<const std::byte> data) override;
  std::unique_ptr<Work> post_recv(int peer, std::uint64_t tag, std::span<std::byte> data) override;
  void abort(const std::string& reason) override;
  std::string abort_reason() const override;
  CommStats stats() const override;
  NativeAllreduce* native_allreduce() override { return this; }
  std::vector<int> nodes() const override;

  // For GlooWork: a wait that failed with Gloo's message `what`. Throws.
  [[noreturn]] void transport_failed(const std::string& op, int peer, std::uint64_t tag,
                                     const std::string& what, Duration timeout);
  [[noreturn]] void throw_aborted() const;
  void forget(GlooWork* work);

 private:
  void allreduce(std::span<float> data, const Fingerprint& fp, bool verify) override;
  std::unique_ptr<Work> post(bool is_send, int peer, std::uint64_t tag, std::byte* data, std::size_t bytes);
  // Records `reason` unless the group is already aborted; wakes waiters, tells peers, closes.
  void abort_group(const std::string& reason);
  // Note [Watching for aborts]: the watcher thread's loop.
  void watch_for_aborts();

  static constexpr std::chrono::milliseconds kWatchPeriod{100};

  const int rank_;
  const int size_;
  std::unique_ptr<RendezvousStore> store_;
  std::shared_ptr<Mesh> mesh_;
  mutable std::mutex mu_;
  std::string reason_;         // guarded by mu_; non-empty once aborted
  std::set<GlooWork*> works_;  // guarded by mu_; transfers not yet complete
  bool stopping_ = false;      // guarded by mu_; the watcher ends
  std::condition_variable watch_cv_;
  std::unique_ptr<RendezvousStore> watch_store_;  // the watcher's own connection to the store
  std::byte empty_{};          // the buffer of 0-byte transfers
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> bytes_received_{0};
  std::atomic<std::uint64_t> messages_sent_{0};
  std::thread watcher_;  // last: started when everything it uses exists
};

}  // namespace lockstep::comm::gloo_backend
