// Modelled link: every message between wrapped ranks takes latency + bytes / bandwidth.
//
// The model. Each rank has one outgoing link, shared by all its peers. A send
// of B bytes posted at time t
//   starts          at s = max(t, link_free)   (transfers on one link are serialised)
//   occupies the link until link_free = s + B / bandwidth
//   is delivered    at link_free + latency.
// The receiver's wait() does not return before the delivery time; the
// sender's wait() does not return before link_free (until then its buffer is
// still "on the wire"). Incoming links are not modelled: a rank receives from
// several peers at once at full rate. A ring all-reduce of P bytes over N
// ranks therefore takes at least 2(N-1) x (latency + (P/N) / bandwidth).
//
// Where the delay is applied. The inner transfer happens at once and the
// delay is added in wait(), on the receiving side, so that only the rank that
// owns an inner communicator ever calls it. The wrappers of one group share a
// Board: per (src, dst, tag), the delivery times of the messages sent,
// numbered in posting order. Messages between one pair under one tag match in
// order, so the k-th irecv of (src, dst, tag) receives the k-th isend and
// looks up delivery time number k. The sender records it before it posts the
// inner send, so it is on the board by the time the inner receive completes.
//
// Sleeping. sleep_for overshoots by ~50-100 us on Linux (timer slack), which
// is the size of the latencies we model. A wait sleeps in slices of at most
// kAbortPoll (checking for an abort between slices) until kSpin before the
// target, then yields until the target. Measured on the shared 2-core build
// machine (load average ~6.5 from other builds), 1000 one-way 8-byte messages
// at 50 us latency and unlimited bandwidth, from the send's post to the
// receive's return: min 50.2 us, median 50.9-51.7 us, p90 51.5-94 us over
// three runs, i.e. a typical per-message error of ~1 us. The p99 (2-4 ms) is
// the scheduler preempting a rank on an oversubscribed machine, not the
// sleep. A plain sleep_for(50 us) there takes a median of ~152 us.
#include "lockstep/comm/modelled_link.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "fingerprint.h"
#include "lockstep/error.h"

namespace lockstep::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

constexpr auto kSpin = std::chrono::microseconds(100);  // yield, don't sleep, this close to a target
constexpr auto kAbortPoll = std::chrono::milliseconds(10);
constexpr double kMaxDelayNs = 1e15;  // ~11.6 days: no overflow however many messages queue up

std::string format(const char* fmt, double value) {
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, value);
  return buf;
}

std::string format_ms(Clock::duration d) {
  return format("%.4g ms", std::chrono::duration<double, std::milli>(d).count());
}

// Splits "2.5GB/s" into 2.5 and "GB/s" (trimmed); nullopt without a leading number.
std::optional<std::pair<double, std::string_view>> split_number(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || text.empty()) return std::nullopt;
  std::string_view unit(end, text.data() + text.size() - end);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  return std::pair{value, unit};
}

[[noreturn]] void bad_bandwidth(std::string_view text) {
  throw InvalidArgument("bad link bandwidth '" + std::string(text) +
                        "': expected a positive rate with a unit, such as 10Gbit, 1Gbit/s, 10gbps, "
                        "2.5GB/s or 500MB/s");
}

[[noreturn]] void bad_latency(std::string_view text) {
  throw InvalidArgument("bad link latency '" + std::string(text) +
                        "': expected a non-negative time with a unit, up to 1e6 s, such as 50us, 1ms, 100ns or 0");
}

nanoseconds transfer_time(std::size_t bytes, double bytes_per_second) {
  if (bytes_per_second <= 0 || bytes == 0) return nanoseconds(0);
  const double ns = static_cast<double>(bytes) / bytes_per_second * 1e9;
  return nanoseconds(static_cast<std::int64_t>(std::min(ns, kMaxDelayNs)));
}

// The messages sent from src to dst under one tag, numbered in posting order.
struct Channel {
  std::uint64_t sends = 0;                                // isends posted
  std::uint64_t recvs = 0;                                // irecvs posted
  std::uint64_t consumed = 0;                             // receives that have taken their delivery time
  std::map<std::uint64_t, Clock::time_point> deliveries;  // by message number
};

// Shared by the wrappers of one group.
struct Board {
  explicit Board(int n) : link_free(n) {}
  std::mutex mu;
  std::vector<Clock::time_point> link_free;                         // by source rank; guarded by mu
  std::map<std::tuple<int, int, std::uint64_t>, Channel> channels;  // by (src, dst, tag); guarded by mu
};

// Sleeps until `target`; throws CommAborted if the group is aborted meanwhile
// (noticed within kAbortPoll).
void sleep_until(const Communicator& comm, Clock::time_point target) {
  for (;;) {
    const auto left = target - Clock::now();
    if (left <= Clock::duration::zero()) return;
    if (left <= kSpin) break;
    if (const std::string reason = comm.abort_reason(); !reason.empty()) {
      throw CommAborted("rank " + std::to_string(comm.rank()) + ": communicator aborted: " + reason);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(left - kSpin, kAbortPoll));
  }
  while (Clock::now() < target) std::this_thread::yield();
}

// What a modelled Work knows about its message, for waiting and for errors.
struct Transfer {
  std::shared_ptr<Communicator> comm;  // the inner communicator
  std::shared_ptr<Board> board;
  LinkModel link;
  int peer = 0;
  std::uint64_t tag = 0;
  std::size_t bytes = 0;
  bool is_send = false;

  // Sleeps until `due`, unless that is beyond the wait's deadline
  // (started + timeout): then aborts the group and throws TimeoutError.
  void pace(Clock::time_point due, Clock::time_point started, Duration timeout) const {
    if (due > deadline_after(timeout, started)) {
      const std::string msg = "rank " + std::to_string(comm->rank()) +
                              (is_send ? ": send to" : ": recv from") + " rank " + std::to_string(peer) +
                              " timed out after " + std::to_string(timeout.count()) + " ms (" +
                              detail::describe_tag(tag) + "): the modelled link (" + link.describe() + ") " +
                              (is_send ? "is busy with the " : "delivers the ") + std::to_string(bytes) +
                              "-byte message until " + format_ms(due - started) + " after the wait began";
      comm->abort(msg);
      throw TimeoutError(msg);
    }
    sleep_until(*comm, due);
  }

  // Note [A dropped transfer aborts the modelled group]: delivery times are
  // numbered per channel in posting order, and the inner backend matches the
  // messages that remain. A send or receive withdrawn before it completed
  // would shift every later message of its channel onto the wrong number (a
  // stale delay, or a receive with none), so the group is aborted instead,
  // as Gloo does; the next call on any rank fails with the reason.
  void dropped() const noexcept {
    try {
      if (!comm->abort_reason().empty()) return;  // an error is already unwinding the step
      comm->abort("rank " + std::to_string(comm->rank()) + (is_send ? ": a send to" : ": a receive from") +
                  " rank " + std::to_string(peer) + " (" + detail::describe_tag(tag) +
                  ") was dropped before it completed, which the modelled link cannot take back");
    } catch (...) {  // a destructor: never throws
    }
  }
};

// A send: done once the inner send is and the link has carried the last byte.
class SendWork final : public Work {
 public:
  SendWork(std::unique_ptr<Work> inner, Transfer transfer, Clock::time_point link_free)
      : inner_(std::move(inner)), transfer_(std::move(transfer)), link_free_(link_free) {}
  ~SendWork() override {
    if (!inner_->done()) transfer_.dropped();  // Note [A dropped transfer aborts the modelled group]
  }

  void wait(Duration timeout) override {
    const auto started = Clock::now();
    inner_->wait(timeout);
    transfer_.pace(link_free_, started, timeout);
  }
  bool done() const override { return inner_->done() && Clock::now() >= link_free_; }

 private:
  std::unique_ptr<Work> inner_;
  Transfer transfer_;
  Clock::time_point link_free_;
};

// A receive: done once the inner receive is and the message's delivery time has come.
class RecvWork final : public Work {
 public:
  RecvWork(std::unique_ptr<Work> inner, Transfer transfer, std::uint64_t number)
      : inner_(std::move(inner)), transfer_(std::move(transfer)), number_(number) {}
  ~RecvWork() override {
    if (due_) return;
    if (!inner_->done()) {
      transfer_.dropped();  // Note [A dropped transfer aborts the modelled group]
      return;
    }
    try {
      take_delivery_time();  // received but never waited for: free its slot on the board
    } catch (...) {  // a destructor: never throws
    }
  }

  void wait(Duration timeout) override {
    const auto started = Clock::now();
    inner_->wait(timeout);
    if (!due_) due_ = take_delivery_time();
    transfer_.pace(*due_, started, timeout);
  }

  bool done() const override {
    if (due_) return Clock::now() >= *due_;
    if (!inner_->done()) return false;
    std::lock_guard lock(transfer_.board->mu);
    const auto& channels = transfer_.board->channels;
    const auto it = channels.find(key());
    if (it == channels.end() || !it->second.deliveries.contains(number_)) return false;
    return Clock::now() >= it->second.deliveries.at(number_);
  }

 private:
  std::tuple<int, int, std::uint64_t> key() const {
    return {transfer_.peer, transfer_.comm->rank(), transfer_.tag};
  }

  // The inner receive has completed, so the matching send has recorded its
  // delivery time (see the opening comment).
  Clock::time_point take_delivery_time() {
    std::lock_guard lock(transfer_.board->mu);
    auto& channels = transfer_.board->channels;
    const auto it = channels.find(key());
    LOCKSTEP_CHECK(it != channels.end() && it->second.deliveries.contains(number_),
                   "a completed receive has no modelled delivery time");
    Channel& channel = it->second;
    const Clock::time_point due = channel.deliveries.at(number_);
    channel.deliveries.erase(number_);
    if (++channel.consumed == channel.sends && channel.consumed == channel.recvs) channels.erase(it);
    return due;
  }

  std::unique_ptr<Work> inner_;
  Transfer transfer_;
  std::uint64_t number_;  // this receive's number on its channel
  std::optional<Clock::time_point> due_;
};

class ModelledLinkCommunicator final : public Communicator {
 public:
  ModelledLinkCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<Board> board,
                           const LinkModel& link)
      : inner_(std::move(inner)), board_(std::move(board)), link_(link) {
    set_timeout(inner_->timeout());
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  std::unique_ptr<Work> post_send(int peer, std::uint64_t tag, std::span<const std::byte> data) override {
    const int me = rank();
    const std::tuple key{me, peer, tag};
    Clock::time_point free_before;
    Clock::time_point link_free;
    std::uint64_t number = 0;
    {
      std::lock_guard lock(board_->mu);
      free_before = board_->link_free[me];
      link_free = std::max(Clock::now(), free_before) + transfer_time(data.size(), link_.bytes_per_second);
      board_->link_free[me] = link_free;
      Channel& channel = board_->channels[key];
      number = channel.sends++;
      channel.deliveries.emplace(number, link_free + link_.latency);
    }
    std::unique_ptr<Work> work;
    try {
      work = inner_->post_send(peer, tag, data);
    } catch (...) {
      // Never posted: take it back (only this rank sends on this channel and link).
      std::lock_guard lock(board_->mu);
      board_->link_free[me] = free_before;
      Channel& channel = board_->channels[key];
      channel.deliveries.erase(number);
      --channel.sends;
      throw;
    }
    return std::make_unique<SendWork>(std::move(work), transfer(peer, tag, data.size(), true), link_free);
  }

  std::unique_ptr<Work> post_recv(int peer, std::uint64_t tag, std::span<std::byte> data) override {
    auto work = inner_->post_recv(peer, tag, data);
    std::uint64_t number = 0;
    {
      std::lock_guard lock(board_->mu);
      number = board_->channels[{peer, rank(), tag}].recvs++;
    }
    return std::make_unique<RecvWork>(std::move(work), transfer(peer, tag, data.size(), false), number);
  }

  void abort(const std::string& reason) override { inner_->abort(reason); }
  std::string abort_reason() const override { return inner_->abort_reason(); }
  CommStats stats() const override { return inner_->stats(); }
  std::vector<int> nodes() const override { return inner_->nodes(); }

  // A backend that compares fingerprints in shared memory (it also has a
  // native all-reduce) sends no message, so there is nothing to model.
  // Otherwise run the default exchange over this wrapper, so that its
  // message pays the link like any other.
  void check_fingerprint(const Fingerprint& fp) override {
    if (inner_->native_allreduce() == nullptr) return Communicator::check_fingerprint(fp);
    inner_->set_timeout(timeout());
    inner_->check_fingerprint(fp);
  }

  // None: collectives use the point-to-point algorithms, whose bytes pay the link.
  NativeAllreduce* native_allreduce() override { return nullptr; }

 private:
  Transfer transfer(int peer, std::uint64_t tag, std::size_t bytes, bool is_send) const {
    return {inner_, board_, link_, peer, tag, bytes, is_send};
  }

  std::shared_ptr<Communicator> inner_;  // shared with the Works, which may outlive us
  std::shared_ptr<Board> board_;
  LinkModel link_;
};

}  // namespace

bool LinkModel::enabled() const {
  return bytes_per_second != 0 || latency.count() != 0;
}

std::string LinkModel::describe() const {
  if (!enabled()) return "no modelled delay";
  std::string s = "unlimited bandwidth";
  if (bytes_per_second > 0) {
    const double bits = bytes_per_second * 8;
    const char* prefix = bits >= 1e12 ? "T" : bits >= 1e9 ? "G" : bits >= 1e6 ? "M" : bits >= 1e3 ? "K" : "";
    const double scale = bits >= 1e12 ? 1e12 : bits >= 1e9 ? 1e9 : bits >= 1e6 ? 1e6 : bits >= 1e3 ? 1e3 : 1;
    s = format("%.4g ", bits / scale) + prefix + "bit/s";
  }
  const double ns = static_cast<double>(latency.count());
  s += ", ";
  if (ns >= 1e9) return s + format("%.4g s", ns / 1e9);
  if (ns >= 1e6) return s + format("%.4g ms", ns / 1e6);
  if (ns >= 1e3 || ns == 0) return s + format("%.4g us", ns / 1e3);
  return s + format("%.4g ns", ns);
}

double parse_bandwidth(std::string_view text) {
  const auto parsed = split_number(text);
  if (!parsed) bad_bandwidth(text);
  auto [value, unit] = *parsed;
  if (!std::isfinite(value) || !(value > 0)) bad_bandwidth(text);
  constexpr std::pair<char, double> kPrefixes[] = {{'k', 1e3}, {'m', 1e6}, {'g', 1e9}, {'t', 1e12}};
  for (const auto& [letter, scale] : kPrefixes) {
    if (unit.size() > 1 && (unit.front() == letter || unit.front() == letter - 'a' + 'A')) {
      value *= scale;
      unit.remove_prefix(1);
      break;
    }
  }
  // A lone "b" is not accepted: bits or bytes would be a guess.
  double bytes_per_second = 0;
  if (unit == "bit" || unit == "bits" || unit == "bit/s" || unit == "bits/s" || unit == "bps") {
    bytes_per_second = value / 8;
  } else if (unit == "B" || unit == "B/s") {
    bytes_per_second = value;
  } else {
    bad_bandwidth(text);
  }
  // 1e-300bit passed as "positive" and made every transfer time infinite.
  if (!(bytes_per_second >= 0.125 && bytes_per_second <= 1e16)) {
    throw InvalidArgument("bad link bandwidth '" + std::string(text) +
                          "': expected a rate from 1 bit/s to 10 PB/s, such as 10Gbit or 2.5GB/s");
  }
  return bytes_per_second;
}

std::chrono::nanoseconds parse_latency(std::string_view text) {
  const auto parsed = split_number(text);
  if (!parsed) bad_latency(text);
  const auto [value, unit] = *parsed;
  if (!std::isfinite(value) || value < 0 || std::signbit(value)) bad_latency(text);
  double scale = 0;
  if (unit == "ns") {
    scale = 1;
  } else if (unit == "us" || unit == "\xc2\xb5s" || unit == "\xce\xbcs") {  // micro sign, Greek mu
    scale = 1e3;
  } else if (unit == "ms") {
    scale = 1e6;
  } else if (unit == "s") {
    scale = 1e9;
  } else if (unit.empty() && value == 0) {
    return nanoseconds(0);
  } else {
    bad_latency(text);
  }
  const double ns = value * scale;
  if (ns > kMaxDelayNs) bad_latency(text);
  return nanoseconds(std::llround(ns));
}

std::vector<std::unique_ptr<Communicator>> with_modelled_link(
    std::vector<std::unique_ptr<Communicator>>&& group, const LinkModel& link) {
  if (!link.enabled()) return std::move(group);
  if (!std::isfinite(link.bytes_per_second) || link.bytes_per_second < 0 || link.latency.count() < 0 ||
      static_cast<double>(link.latency.count()) > kMaxDelayNs) {
    throw InvalidArgument("bad link model: bandwidth " + format("%g", link.bytes_per_second) +
                          " bytes/s and latency " + std::to_string(link.latency.count()) +
                          " ns must be finite and non-negative");
  }
  const int n = static_cast<int>(group.size());
  for (int r = 0; r < n; ++r) {
    if (!group[r]) {
      throw InvalidArgument("with_modelled_link needs every rank of one group in rank order; entry " +
                            std::to_string(r) + " is null");
    }
    if (group[r]->rank() != r || group[r]->size() != n) {
      throw InvalidArgument("with_modelled_link needs every rank of one group in rank order; entry " +
                            std::to_string(r) + " of the " + std::to_string(n) + " given is rank " +
                            std::to_string(group[r]->rank()) + " of a group of " +
                            std::to_string(group[r]->size()));
    }
  }
  auto board = std::make_shared<Board>(n);
  std::vector<std::unique_ptr<Communicator>> wrapped;
  for (auto& comm : group) {
    wrapped.push_back(std::make_unique<ModelledLinkCommunicator>(std::move(comm), board, link));
  }
  return wrapped;
}

}  // namespace lockstep::comm
