// Test double: a communicator that exposes only the point-to-point interface
// of another one, as a network backend would (no native collective, the
// default fingerprint check), and can fail on purpose after a number of sends.
#pragma once

#include "lockstep/comm/communicator.h"
#include "lockstep/error.h"

namespace lockstep::testing {

class PointToPointOnly final : public comm::Communicator {
 public:
  // fail_after_sends >= 0: the send after that many sends throws, as a
  // replica that dies in the middle of a collective.
  explicit PointToPointOnly(comm::Communicator& inner, int fail_after_sends = -1)
      : inner_(inner), fail_after_(fail_after_sends) {
    set_timeout(inner.timeout());
  }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::unique_ptr<comm::Work> post_send(int peer, std::uint64_t tag, std::span<const std::byte> data) override {
    if (fail_after_ >= 0 && sends_++ == fail_after_) {
      throw Error("injected failure in send " + std::to_string(fail_after_));
    }
    return inner_.post_send(peer, tag, data);
  }
  std::unique_ptr<comm::Work> post_recv(int peer, std::uint64_t tag, std::span<std::byte> data) override {
    return inner_.post_recv(peer, tag, data);
  }
  void abort(const std::string& reason) override { inner_.abort(reason); }
  std::string abort_reason() const override { return inner_.abort_reason(); }
  comm::CommStats stats() const override { return inner_.stats(); }

 private:
  comm::Communicator& inner_;
  int fail_after_;
  int sends_ = 0;
};

}  // namespace lockstep::testing
