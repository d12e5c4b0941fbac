// Private: one MPI request as a lockstep Work.
//
// wait(timeout) polls MPI_Test until the request completes, the deadline
// passes, or an abort notice arrives (Note [Abort over MPI]). It does not
// spin a core away: Note [Polling with back-off] in mpi_work.cpp.
#pragma once

#include <mpi.h>

#include <memory>

#include "lockstep/comm/communicator.h"
#include "mpi_channel.h"

namespace lockstep::comm::detail {

enum class MpiOp { Send, Recv, Allreduce };

struct MpiRequestInfo {
  MpiOp op = MpiOp::Send;
  int peer = -1;           // -1 for a collective
  std::uint64_t tag = 0;   // the lockstep tag (the sequence number for a collective)
  std::size_t bytes = 0;   // a receive's expected size
  std::string collective;  // describe(fingerprint) for a collective, else empty
};

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<MpiChannel> channel, MPI_Request request, MpiRequestInfo info)
      : channel_(std::move(channel)), request_(request), info_(std::move(info)) {}
  ~MpiWork() override;  // releases a request never waited for; never throws

  // TimeoutError naming rank, peer, operation and tag (and aborts the group);
  // CommAborted if the group was aborted; CommAborted if a received message
  // has another size than expected (and aborts the group).
  void wait(Duration timeout) override;
  bool done() const override;

 private:
  // One MPI_Test; true once the request has completed (request_ is then null).
  bool test() const;
  // Called once the request completed: a receive of the wrong size aborts.
  void check_completion();
  std::string who() const;  // "rank 3: recv from rank 2"
  MpiChannel::Kind kind() const {
    return info_.op == MpiOp::Send   ? MpiChannel::Kind::Send
           : info_.op == MpiOp::Recv ? MpiChannel::Kind::Recv
                                     : MpiChannel::Kind::Collective;
  }

  std::shared_ptr<MpiChannel> channel_;
  mutable MPI_Request request_;
  mutable MPI_Status status_{};
  mutable int error_ = MPI_SUCCESS;  // the completed request's error code
  MpiRequestInfo info_;
};

}  // namespace lockstep::comm::detail
