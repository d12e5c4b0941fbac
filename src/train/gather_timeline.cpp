// Every rank's timeline on rank 0, for --trace and --timeline-svg over a
// process group. Each rank's events count microseconds from its own start,
// on its own clock, and machines do not share a clock; so rank 0 first
// measures each rank's offset from its own clock (Cristian's algorithm), then
// receives that rank's events and moves them onto its clock.
//
//   1. For r = 1 .. N-1, one rank at a time (the others wait in their first
//      receive, a few round trips a rank): kProbes round trips. Rank 0 sends
//      an 8-byte probe and notes the time; rank r answers at once with its
//      clock's reading (8 bytes); rank 0 notes when the answer came. offset =
//      answer - (sent + answered) / 2, taken from the shortest round trip:
//      wrong by at most half of it (tens of microseconds on one host, against
//      steps of milliseconds).
//   2. Every rank r sends the size of its events in bytes (8 bytes), then the
//      events (46 bytes plus the name each, serialize_events). Rank 0 posts
//      the N-1 receives of each at once, so no rank's wait holds the other
//      ranks' transfers one after another: served in turn, rank N-1 waited
//      for N-2 timelines in the receive of its first probe, and a long run's
//      timelines on a slow link outlasted --timeout there.
// Bytes on the wire: rank 0 sends 8 x kProbes per rank; rank r sends
// 8 x kProbes + 8 + its events. Messages: 2 x kProbes + 2 per rank.
//
// Runs after training, when no collective is in flight, so its tags are free
// (communicator.h); their low 16 bits differ, as the MPI backend needs.
#include "gather_timeline.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "lockstep/error.h"

namespace lockstep::train::detail {
namespace {

constexpr int kProbes = 8;
// Far above a long run's events (10 epochs of the default MLP: ~2.5 MB per
// rank); a larger size is not a timeline.
constexpr std::uint64_t kMaxBytes = std::uint64_t(1) << 30;
constexpr std::uint64_t kTagProbe = 0x7101, kTagAnswer = 0x7102, kTagSize = 0x7103, kTagEvents = 0x7104;

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

template <class T>
void put(std::vector<std::byte>& out, const T& v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <class T>
  T get() {
    T v;
    if (sizeof v > bytes_.size() - at_) throw Error("a rank's timeline ends inside an event");
    std::memcpy(&v, bytes_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string text(std::size_t n) {
    if (n > bytes_.size() - at_) throw Error("a rank's timeline ends inside an event's name");
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return s;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
};

template <class T>
void send_value(comm::Communicator& comm, int peer, std::uint64_t tag, const T& v) {
  comm::send(comm, peer, tag, std::as_bytes(std::span(&v, 1)));
}
template <class T>
T recv_value(comm::Communicator& comm, int peer, std::uint64_t tag) {
  T v{};
  comm::recv(comm, peer, tag, std::as_writable_bytes(std::span(&v, 1)));
  return v;
}

// Rank 0: how far `peer`'s clock (microseconds since its t0) is ahead of ours.
double measure_offset(comm::Communicator& comm, int peer, Clock::time_point t0) {
  double best_rtt = std::numeric_limits<double>::infinity(), offset = 0;
  for (int i = 0; i < kProbes; ++i) {
    double answer = 0;
    auto answered = comm.irecv(peer, kTagAnswer, std::as_writable_bytes(std::span(&answer, 1)));
    const double sent = us_since(t0);
    send_value(comm, peer, kTagProbe, sent);
    answered->wait(comm.timeout());
    const double back = us_since(t0);
    if (back - sent < best_rtt) {
      best_rtt = back - sent;
      offset = answer - (sent + back) / 2;
    }
  }
  return offset;
}

}  // namespace

std::vector<std::byte> serialize_events(const std::vector<TimelineEvent>& events) {
  std::vector<std::byte> out;
  for (const TimelineEvent& e : events) {
    put(out, std::int32_t(e.replica));
    put(out, std::uint8_t(e.track));
    put(out, std::uint8_t(e.phase));
    put(out, std::int64_t(e.step));
    put(out, e.start_us);
    put(out, e.end_us);
    put(out, std::uint64_t(e.bytes));
    put(out, std::int32_t(e.layer));
    put(out, std::uint32_t(e.name.size()));
    const auto* p = reinterpret_cast<const std::byte*>(e.name.data());
    out.insert(out.end(), p, p + e.name.size());
  }
  return out;
}

std::vector<TimelineEvent> deserialize_events(std::span<const std::byte> bytes) {
  std::vector<TimelineEvent> events;
  Reader in(bytes);
  while (!in.done()) {
    TimelineEvent e;
    e.replica = in.get<std::int32_t>();
    const auto track = in.get<std::uint8_t>(), phase = in.get<std::uint8_t>();
    if (track > std::uint8_t(Track::Comm) || phase > std::uint8_t(Phase::Allreduce))
      throw Error("a rank's timeline has an event of unknown track or phase");
    e.track = Track(track);
    e.phase = Phase(phase);
    e.step = in.get<std::int64_t>();
    e.start_us = in.get<double>();
    e.end_us = in.get<double>();
    e.bytes = in.get<std::uint64_t>();
    e.layer = in.get<std::int32_t>();
    e.name = in.text(in.get<std::uint32_t>());
    events.push_back(std::move(e));
  }
  return events;
}

namespace {

std::vector<TimelineEvent> gather_unnamed(comm::Communicator& comm, std::vector<TimelineEvent> mine,
                                          Clock::time_point t0) {
  if (comm.rank() != 0) {
    for (int i = 0; i < kProbes; ++i) {
      recv_value<double>(comm, 0, kTagProbe);
      send_value(comm, 0, kTagAnswer, us_since(t0));
    }
    const auto bytes = serialize_events(mine);
    send_value(comm, 0, kTagSize, std::uint64_t(bytes.size()));
    if (!bytes.empty()) comm::send(comm, 0, kTagEvents, bytes);
    return mine;
  }
  const int n = comm.size();
  std::vector<double> offsets(n, 0.0);
  for (int r = 1; r < n; ++r) offsets[r] = measure_offset(comm, r, t0);
  std::vector<std::uint64_t> sizes(n, 0);
  std::vector<std::unique_ptr<comm::Work>> pending(n);
  for (int r = 1; r < n; ++r) pending[r] = comm.irecv(r, kTagSize, std::as_writable_bytes(std::span(&sizes[r], 1)));
  for (int r = 1; r < n; ++r) pending[r]->wait(comm.timeout());
  std::vector<std::vector<std::byte>> bytes(n);
  for (int r = 1; r < n; ++r) {
    if (sizes[r] > kMaxBytes)
      throw Error("rank " + std::to_string(r) + " announced a timeline of " + std::to_string(sizes[r]) +
                  " bytes, more than the " + std::to_string(kMaxBytes) + " rank 0 accepts");
    bytes[r].resize(sizes[r]);
  }
  for (int r = 1; r < n; ++r) pending[r] = bytes[r].empty() ? nullptr : comm.irecv(r, kTagEvents, bytes[r]);
  for (int r = 1; r < n; ++r) {
    if (pending[r]) pending[r]->wait(comm.timeout());
    for (TimelineEvent& e : deserialize_events(bytes[r])) {
      e.start_us -= offsets[r];
      e.end_us -= offsets[r];
      mine.push_back(std::move(e));
    }
  }
  // A rank that started before rank 0 has events before its zero: start the
  // timeline at the earliest event instead.
  double first = 0;
  for (const TimelineEvent& e : mine) first = std::min(first, e.start_us);
  for (TimelineEvent& e : mine) {
    e.start_us -= first;
    e.end_us -= first;
  }
  return mine;
}

}  // namespace

// Its sends and receives carry bare tags ("recv from rank 1 timed out after
// 5000 ms (tag 28930)"): a rank lost or hung while the timelines are gathered,
// after the last step, is named with the operation, of the same class.
std::vector<TimelineEvent> gather_timeline(comm::Communicator& comm, std::vector<TimelineEvent> mine,
                                           Clock::time_point t0) {
  const std::string what = "gathering every rank's timeline on rank 0 (--trace, --timeline-svg, --profile): ";
  try {
    return gather_unnamed(comm, std::move(mine), t0);
  } catch (const CommAborted& e) {
    throw CommAborted(what + e.what());
  } catch (const TimeoutError& e) {
    throw TimeoutError(what + e.what());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(what + e.what());
  } catch (const IoError& e) {
    throw IoError(what + e.what());
  } catch (const Error& e) {
    throw Error(what + e.what());
  }
}

}  // namespace lockstep::train::detail
