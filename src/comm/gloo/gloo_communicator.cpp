// The Communicator over Gloo's TCP pairs (gloo_communicator.h) and its
// native all-reduce (gloo::allreduce, the ring).
#include "gloo_communicator.h"

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/transport/unbound_buffer.h>

#include "algorithms.h"
#include "fingerprint.h"
#include "peer_check.h"
#include "lockstep/error.h"
#include "sigpipe.h"

namespace lockstep::comm::gloo_backend {

// One transfer: its buffer stays registered with the communicator until it
// completes, so abort() can wake the thread that waits for it.
class GlooWork final : public Work {
 public:
  GlooWork(GlooCommunicator& comm, std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool is_send,
           int peer, std::uint64_t tag)
      : comm_(comm), buf_(std::move(buf)), is_send_(is_send), peer_(peer), tag_(tag) {}

  // A transfer dropped before it completed leaves Gloo's pair expecting it:
  // the group cannot go on (forget() aborts it unless it already is). Never throws.
  ~GlooWork() override {
    if (!done_) comm_.forget(this);
  }

  void wait(Duration timeout) override {
    if (done_) return;
    bool ok = false;
    try {
      const Duration bounded = std::min(timeout, kMaxTimeout);
      ok = is_send_ ? buf_->waitSend(nullptr, bounded) : buf_->waitRecv(nullptr, bounded);
    } catch (const std::exception& e) {
      comm_.transport_failed(describe(), peer_, tag_, e.what(), timeout);
    }
    if (!ok) comm_.throw_aborted();  // abort() woke us
    done_ = true;
    comm_.forget(this);
  }

  bool done() const override { return done_; }  // Gloo has no non-blocking test: true once wait() returned

  void wake() { is_send_ ? buf_->abortWaitSend() : buf_->abortWaitRecv(); }

  std::string describe() const {
    return std::string(is_send_ ? "send to" : "recv from") + " rank " + std::to_string(peer_);
  }

 private:
  GlooCommunicator& comm_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  const bool is_send_;
  const int peer_;
  const std::uint64_t tag_;
  bool done_ = false;
};

namespace {

std::string strip_location(const std::string& what) {  // gloo prefixes "[file:line] "
  if (!what.empty() && what[0] == '[') {
    if (const auto end = what.find("] "); end != std::string::npos) return what.substr(end + 2);
  }
  return what;
}

bool is_timeout(const std::string& what) {
  return what.find("Timed out waiting") != std::string::npos;
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::unique_ptr<RendezvousStore> store, std::shared_ptr<Mesh> mesh)
    : rank_(mesh->rank), size_(mesh->size), store_(std::move(store)), mesh_(std::move(mesh)) {
  watch_store_ = std::make_unique<RendezvousStore>(store_->address(), store_->job_id(), store_->io_timeout());
  watch_store_->set_session(store_->session());
  watcher_ = std::thread([this] { watch_for_aborts(); });
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  watcher_.join();
}

void GlooCommunicator::watch_for_aborts() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    watch_cv_.wait_for(lock, kWatchPeriod);
    if (stopping_ || !reason_.empty() || works_.empty()) continue;
    lock.unlock();
    const auto reason = read_abort(*watch_store_);  // never throws; nullopt if none
    lock.lock();
    if (!reason || !reason_.empty() || stopping_) continue;
    reason_ = *reason;
    for (GlooWork* w : works_) w->wake();
    lock.unlock();
    mesh_->close_all();  // as transport_failed does when it finds a reason: peers waiting on us fail too
    lock.lock();
  }
}

std::unique_ptr<Work> GlooCommunicator::post_send(int peer, std::uint64_t tag, std::span<const std::byte> data) {
  bytes_sent_ += data.size();
  ++messages_sent_;
  return post(true, peer, tag, const_cast<std::byte*>(data.data()), data.size());  // Gloo only reads it
}

std::unique_ptr<Work> GlooCommunicator::post_recv(int peer, std::uint64_t tag, std::span<std::byte> data) {
  bytes_received_ += data.size();
  return post(false, peer, tag, data.data(), data.size());
}

std::unique_ptr<Work> GlooCommunicator::post(bool is_send, int peer, std::uint64_t tag, std::byte* data,
                                             std::size_t bytes) {
  detail::check_peer(rank_, size_, peer, is_send ? "send to" : "recv from");
  {
    std::lock_guard lock(mu_);
    if (!reason_.empty())
      throw CommAborted("rank " + std::to_string(rank_) + ": communicator aborted: " + reason_);
  }
  // Gloo wants a pointer even for 0 bytes (it never touches it then).
  auto buf = mesh_->createUnboundBuffer(bytes ? data : &empty_, bytes);
  try {
    const ScopedSigpipeBlock no_sigpipe;  // Gloo may write from this thread (sigpipe.h)
    is_send ? buf->send(peer, tag) : buf->recv(peer, tag);
  } catch (const std::exception& e) {  // the pair already failed
    transport_failed(std::string(is_send ? "send to" : "recv from") + " rank " + std::to_string(peer), peer,
                     tag, e.what(), timeout());
  }
  // Registered after it was posted: an abort() in between closes the pairs,
  // which fails this transfer's wait just the same.
  auto work = std::make_unique<GlooWork>(*this, std::move(buf), is_send, peer, tag);
  std::lock_guard lock(mu_);
  works_.insert(work.get());
  return work;
}

void GlooCommunicator::forget(GlooWork* work) {
  bool abandoned = false;
  {
    std::lock_guard lock(mu_);
    abandoned = works_.erase(work) > 0 && reason_.empty() && !work->done();
  }
  if (abandoned) {
    abort_group("rank " + std::to_string(rank_) + ": a " + work->describe() +
                " was abandoned before it completed");
  }
}

void GlooCommunicator::throw_aborted() const {
  std::lock_guard lock(mu_);
  throw CommAborted("rank " + std::to_string(rank_) + ": communicator aborted: " + reason_);
}

void GlooCommunicator::transport_failed(const std::string& op, int peer, std::uint64_t tag,
                                        const std::string& what, Duration timeout) {
  if (!abort_reason().empty()) throw_aborted();
  const std::string me = "rank " + std::to_string(rank_);
  const std::string where = " (" + detail::describe_tag(tag) + ")";
  if (is_timeout(what)) {
    const std::string msg =
        me + ": " + op + " timed out after " + std::to_string(timeout.count()) + " ms" + where;
    abort_group(msg);
    throw TimeoutError(msg);
  }
  // A connection broke. A rank that aborts records why before it closes its
  // connections, so read that first; if there is nothing, the peer itself failed.
  if (auto reason = read_abort(*store_)) {
    {
      std::lock_guard lock(mu_);
      if (reason_.empty()) reason_ = *reason;
    }
    mesh_->close_all();
    throw_aborted();
  }
  int culprit = mesh_->peer_named_in(what);
  if (culprit < 0) culprit = peer;
  const std::string who =
      culprit >= 0 ? "rank " + std::to_string(culprit) + " (" + mesh_->peer_address(culprit) + ")" : "a peer";
  const std::string msg = me + ": " + op + " failed" + where + ": lost the connection to " + who +
                          ", which died or " + "closed it [" + strip_location(what) + "]";
  abort_group(msg);
  throw CommAborted(msg);
}

void GlooCommunicator::abort_group(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (!reason_.empty()) return;
    reason_ = reason;
    for (GlooWork* w : works_) w->wake();
  }
  publish_abort(*store_, reason);
  mesh_->close_all();
}

void GlooCommunicator::abort(const std::string& reason) {
  abort_group(reason.empty() ? "aborted" : reason);
}

std::string GlooCommunicator::abort_reason() const {
  std::lock_guard lock(mu_);
  return reason_;
}

CommStats GlooCommunicator::stats() const {
  return {bytes_sent_.load(), bytes_received_.load(), messages_sent_.load()};
}

std::vector<int> GlooCommunicator::nodes() const { return mesh_->nodes(); }

void GlooCommunicator::allreduce(std::span<float> data, const Fingerprint& fp, bool verify) {
  if (verify) check_fingerprint(fp);
  if (size_ > 1 && !data.empty()) {
    gloo::AllreduceOptions opts(mesh_);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setOutput(data.data(), data.size());
    using Fn = void (*)(void*, const void*, const void*, std::size_t);
    opts.setReduceFunction(fp.op == ReduceOp::Max   ? static_cast<Fn>(&gloo::max<float>)
                           : fp.op == ReduceOp::Min ? static_cast<Fn>(&gloo::min<float>)
                                                    : static_cast<Fn>(&gloo::sum<float>));
    opts.setTag(static_cast<std::uint32_t>(fp.sequence));
    opts.setTimeout(std::min(timeout(), kMaxTimeout));
    try {
      const ScopedSigpipeBlock no_sigpipe;
      gloo::allreduce(opts);
    } catch (const std::exception& e) {
      transport_failed("native all-reduce", -1, detail::make_tag(fp.sequence, 0), e.what(), timeout());
    }
    // Booked as a ring's traffic: Gloo does not report what it sent. No
    // messages are booked, so a report can tell booked bytes from counted ones.
    const std::uint64_t bytes = data.size_bytes() * 2 * (size_ - 1) / size_;
    bytes_sent_ += bytes;
    bytes_received_ += bytes;
  }
  detail::finish(data, fp.op, size_);
}

}  // namespace lockstep::comm::gloo_backend
