// Threads backend: a mailbox shared by the ranks of one process.
//
// Matching: an unmatched send or receive is parked in the destination rank's
// mailbox. The second party to arrive takes the parked op out, copies the
// payload once (sender's buffer -> receiver's buffer) outside the lock, then
// marks both sides done and wakes the owner of the parked op.
//
// Note [Buffer lifetime on abort]: a parked op may be in the middle of being
// copied by the other party when the group aborts. Its owner must not return
// (and free the buffer) until that copy has finished, so wait() blocks while
// the op is in state kCopying, which always ends in microseconds.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>

#include "lockstep/comm/collectives.h"
#include "lockstep/comm/threads.h"
#include "lockstep/error.h"
#include "peer_check.h"
#include "tags.h"
#include "threads_hub.h"

namespace lockstep::comm {
namespace {

using detail::Hub;
using detail::Op;
using detail::OpState;

std::string describe(const Op& op, int waiter) {
  if (op.is_send) {
    return "rank " + std::to_string(waiter) + ": send to rank " + std::to_string(op.dst);
  }
  return "rank " + std::to_string(waiter) + ": recv from rank " + std::to_string(op.src);
}

class ThreadWork final : public Work {
 public:
  ThreadWork(std::shared_ptr<Hub> hub, std::shared_ptr<Op> op, int owner)
      : hub_(std::move(hub)), op_(std::move(op)), owner_(owner) {}

  // A Work dropped without wait() (an exception unwinding past it) must not
  // leave its buffer to a peer: unpark the op, or wait out a copy in flight
  // (Note [Buffer lifetime on abort]). Never throws.
  ~ThreadWork() override {
    if (!op_) return;
    std::unique_lock lock(hub_->mu);
    if (op_->state == OpState::kParked) {
      unpark_locked();
      return;
    }
    hub_->cv[owner_].wait(lock, [&] { return op_->state == OpState::kDone; });
  }

  void wait(Duration timeout) override {
    if (!op_ && !failed_) return;
    std::unique_lock lock(hub_->mu);
    if (failed_) throw aborted_locked();  // withdrawn by an earlier wait, which aborted the group
    const auto deadline = deadline_after(timeout);
    auto& cv = hub_->cv[owner_];
    while (op_->state != OpState::kDone) {
      if (hub_->aborted && op_->state == OpState::kParked) {
        unpark_locked();
        failed_ = true;
        throw aborted_locked();
      }
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && op_->state == OpState::kParked) {
        const std::string msg = describe(*op_, owner_) + " timed out after " +
                                std::to_string(timeout.count()) + " ms (" +
                                detail::describe_tag(op_->tag) + ")";
        unpark_locked();
        failed_ = true;
        hub_->abort_locked(msg);
        throw TimeoutError(msg);
      }
    }
    op_.reset();
  }

  // A transfer whose wait failed never completed.
  bool done() const override {
    if (!op_) return !failed_;
    std::lock_guard lock(hub_->mu);
    return op_->state == OpState::kDone;
  }

 private:
  CommAborted aborted_locked() const {
    return CommAborted("rank " + std::to_string(owner_) + ": communicator aborted: " + hub_->abort_reason);
  }

  // Removes our parked op so nobody copies into/out of a dead buffer.
  void unpark_locked() {
    auto& queue = op_->is_send ? hub_->parked_sends[op_->dst] : hub_->parked_recvs[op_->dst];
    std::erase(queue, op_);
    op_.reset();
  }

  std::shared_ptr<Hub> hub_;
  std::shared_ptr<Op> op_;  // null once complete or withdrawn
  int owner_;
  bool failed_ = false;  // wait() withdrew the op and threw: the transfer never completed
};

class ThreadCommunicator final : public Communicator, private NativeAllreduce {
 public:
  ThreadCommunicator(std::shared_ptr<Hub> hub, int rank, int size, int ranks_per_node)
      : hub_(std::move(hub)), rank_(rank), size_(size), ranks_per_node_(ranks_per_node) {}

  // Destroyed while an exception unwinds (its rank's thread failed and did
  // not abort): the others would wait for this rank until their timeout and
  // then blame it with no cause, so the group is aborted here. A communicator
  // destroyed normally aborts nothing: its rank may simply be done first.
  ~ThreadCommunicator() override {
    if (std::uncaught_exceptions() == 0) return;
    std::lock_guard lock(hub_->mu);
    if (!hub_->aborted) {
      hub_->abort_locked("rank " + std::to_string(rank_) +
                         "'s communicator was destroyed while an exception unwound its thread (rank " +
                         std::to_string(rank_) + " failed)");
    }
  }

  std::vector<int> nodes() const override {
    if (ranks_per_node_ <= 0) return {};
    std::vector<int> out(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) out[static_cast<std::size_t>(r)] = r / ranks_per_node_;
    return out;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Work> post_send(int peer, std::uint64_t tag, std::span<const std::byte> data) override {
    check_peer(peer, "send to");
    bytes_sent_ += data.size();
    ++messages_sent_;
    auto op = std::make_shared<Op>(Op{rank_, peer, tag, true, data.data(), nullptr, data.size()});
    return post(op, hub_->parked_recvs[peer], hub_->parked_sends[peer]);
  }

  std::unique_ptr<Work> post_recv(int peer, std::uint64_t tag, std::span<std::byte> data) override {
    check_peer(peer, "recv from");
    bytes_received_ += data.size();
    auto op = std::make_shared<Op>(Op{peer, rank_, tag, false, nullptr, data.data(), data.size()});
    return post(op, hub_->parked_sends[rank_], hub_->parked_recvs[rank_]);
  }

  void abort(const std::string& reason) override {
    std::lock_guard lock(hub_->mu);
    hub_->abort_locked(reason);
  }

  std::string abort_reason() const override {
    std::lock_guard lock(hub_->mu);
    return hub_->aborted ? hub_->abort_reason : std::string();
  }

  NativeAllreduce* native_allreduce() override { return this; }
  void check_fingerprint(const Fingerprint& fp) override {
    detail::publish_and_check(*hub_, rank_, fp, true, timeout());
  }

  CommStats stats() const override {
    return {bytes_sent_.load(), bytes_received_.load(), messages_sent_.load()};
  }

 private:
  bool shares_memory() const override { return true; }
  void allreduce(std::span<float> data, const Fingerprint& fp, bool verify) override {
    detail::shared_memory_allreduce(*hub_, rank_, data, fp, verify, timeout());
    const std::size_t chunk = data.size() * (rank_ + 1) / size_ - data.size() * rank_ / size_;
    count_sent((data.size() - chunk + chunk * (size_ - 1)) * sizeof(float));
  }
  // Counted as allreduce() counts its two phases: the part of this buffer
  // other ranks read, then this rank's chunk written into N-1 others.
  void reduce_scatter(std::span<float> data, const Fingerprint& fp, bool verify) override {
    detail::shared_memory_reduce_scatter(*hub_, rank_, data, fp, verify, timeout());
    count_sent((data.size() - own_chunk(data.size())) * sizeof(float));
  }
  void all_gather(std::span<float> data, const Fingerprint& fp, bool verify) override {
    detail::shared_memory_all_gather(*hub_, rank_, data, fp, verify, timeout());
    count_sent(own_chunk(data.size()) * (size_ - 1) * sizeof(float));
  }
  std::size_t own_chunk(std::size_t count) const {
    const auto [begin, end] = shard_range(count, rank_, size_);
    return end - begin;
  }
  void count_sent(std::uint64_t bytes) {
    bytes_sent_ += bytes;
    bytes_received_ += bytes;
  }

  void check_peer(int peer, const char* what) const { detail::check_peer(rank_, size_, peer, what); }

  // Matches `op` against the other side's parked ops, or parks it.
  std::unique_ptr<Work> post(const std::shared_ptr<Op>& op, std::deque<std::shared_ptr<Op>>& counterparts,
                             std::deque<std::shared_ptr<Op>>& parking) {
    std::unique_lock lock(hub_->mu);
    if (hub_->aborted) {
      throw CommAborted("rank " + std::to_string(rank_) + ": communicator aborted: " + hub_->abort_reason);
    }
    for (auto it = counterparts.begin(); it != counterparts.end(); ++it) {
      Op& other = **it;
      if (other.src != op->src || other.tag != op->tag) continue;
      std::shared_ptr<Op> parked = *it;
      counterparts.erase(it);
      if (parked->bytes != op->bytes) {
        const std::size_t sent = op->is_send ? op->bytes : parked->bytes;
        const std::size_t expected = op->is_send ? parked->bytes : op->bytes;
        const std::string msg = "rank " + std::to_string(op->dst) + ": message from rank " +
                                std::to_string(op->src) + " has " + std::to_string(sent) + " bytes where " +
                                std::to_string(expected) + " were expected";
        hub_->abort_locked(msg);
        throw CommAborted(msg);
      }
      parked->state = OpState::kCopying;
      lock.unlock();
      const std::byte* from = op->is_send ? op->send_data : parked->send_data;
      std::byte* to = op->is_send ? parked->recv_data : op->recv_data;
      if (op->bytes) std::memcpy(to, from, op->bytes);
      lock.lock();
      parked->state = OpState::kDone;
      const int owner = parked->is_send ? parked->src : parked->dst;
      hub_->cv[owner].notify_all();
      return std::make_unique<ThreadWork>(hub_, nullptr, rank_);
    }
    parking.push_back(op);
    return std::make_unique<ThreadWork>(hub_, op, rank_);
  }

  std::shared_ptr<Hub> hub_;
  int rank_;
  int size_;
  int ranks_per_node_;
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> bytes_received_{0};
  std::atomic<std::uint64_t> messages_sent_{0};
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_group(const ThreadGroupOptions& options) {
  if (options.world_size < 1 || options.world_size > 1024) {
    throw InvalidArgument("a thread group needs 1 to 1024 ranks, got " + std::to_string(options.world_size));
  }
  if (options.ranks_per_node < 0) {
    throw InvalidArgument("ranks per node must be 0 (unknown) or positive, got " +
                          std::to_string(options.ranks_per_node));
  }
  if (options.timeout <= Duration::zero()) {
    throw InvalidArgument("a thread group needs a positive timeout, got " + std::to_string(options.timeout.count()) +
                          " ms; every blocking call would fail at once.");
  }
  auto hub = std::make_shared<Hub>(options.world_size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < options.world_size; ++r) {
    comms.push_back(std::make_unique<ThreadCommunicator>(hub, r, options.world_size, options.ranks_per_node));
    comms.back()->set_timeout(options.timeout);
  }
  return comms;
}

}  // namespace lockstep::comm
