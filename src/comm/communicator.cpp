#include "lockstep/comm/communicator.h"

#include <string>

#include "lockstep/error.h"
#include "tags.h"

namespace lockstep::comm {

std::chrono::steady_clock::time_point deadline_after(Duration timeout, std::chrono::steady_clock::time_point from) {
  using TimePoint = std::chrono::steady_clock::time_point;
  if (timeout <= Duration::zero()) return from;
  // Whole milliseconds left before the clock's end; below that the sum fits.
  const auto room = std::chrono::duration_cast<Duration>(TimePoint::max() - from);
  return timeout >= room ? TimePoint::max() : from + timeout;
}

void refuse_call(Communicator& comm, const std::string& what) {
  std::string reason = "rank ";  // built with += : GCC 12 warns falsely (-Wrestrict) on a + chain here
  reason += std::to_string(comm.rank());
  reason += ": ";
  reason += what;
  comm.abort(reason);
  throw InvalidArgument(what);
}

void Communicator::set_timeout(Duration timeout) {
  if (timeout <= Duration::zero()) {
    throw InvalidArgument("Communicator::set_timeout: the timeout must be positive, got " +
                          std::to_string(timeout.count()) + " ms; every blocking call would fail at once.");
  }
  timeout_ = timeout;
}

std::span<std::byte> Communicator::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return {scratch_.data(), bytes};
}

namespace {

void check_program_tag(Communicator& comm, const char* call, std::uint64_t tag) {
  if (tag >= detail::kCollectiveTagBit) {
    refuse_call(comm, std::string(call) + " was given tag " + std::to_string(tag) +
                          ", which is the library's (2^62 and above carry its collectives and channels); a " +
                          "program's tags are below 2^62");
  }
}

}  // namespace

std::unique_ptr<Work> Communicator::isend(int peer, std::uint64_t tag, std::span<const std::byte> data) {
  check_program_tag(*this, "isend", tag);
  return post_send(peer, tag, data);
}

std::unique_ptr<Work> Communicator::irecv(int peer, std::uint64_t tag, std::span<std::byte> data) {
  check_program_tag(*this, "irecv", tag);
  return post_recv(peer, tag, data);
}

void send(Communicator& comm, int peer, std::uint64_t tag, std::span<const std::byte> data) {
  comm.isend(peer, tag, data)->wait(comm.timeout());
}

void recv(Communicator& comm, int peer, std::uint64_t tag, std::span<std::byte> data) {
  comm.irecv(peer, tag, data)->wait(comm.timeout());
}

}  // namespace lockstep::comm
