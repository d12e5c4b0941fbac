// The state one MPI communicator shares with its Works, and abort by message
// (Note [Abort over MPI] in mpi_channel.h).
#include "mpi_channel.h"

#include <chrono>
#include <thread>

#include "lockstep/comm/communicator.h"
#include "lockstep/error.h"
#include "mpi_tags.h"

namespace lockstep::comm::detail {

MpiChannel::MpiChannel(std::shared_ptr<MpiSession> session, MPI_Comm parent, std::chrono::milliseconds timeout)
    : session_(std::move(session)) {
  {
    // MPI_Comm_dup would wait for every rank with no deadline.
    MPI_Request request = MPI_REQUEST_NULL;
    int parent_rank = 0;
    {
      auto lock = session_->lock();
      MPI_Comm_rank(parent, &parent_rank);
      check_mpi(MPI_Comm_idup(parent, &comm_, &request), "MPI_Comm_idup");
    }
    const auto deadline = deadline_after(timeout);
    for (int done = 0; !done;) {
      {
        auto lock = session_->lock();
        check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      }
      if (done) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        session_->mark_failed();  // Note [MPI_Finalize after a failure]
        throw TimeoutError("rank " + std::to_string(parent_rank) + ": connecting over MPI timed out after " +
                           std::to_string(timeout.count()) +
                           " ms duplicating the communicator (a rank did not connect)");
      }
      std::this_thread::yield();  // a nonblocking collective advances only inside MPI calls
    }
  }
  auto lock = session_->lock();
  // Errors come back as codes (turned into exceptions), never kill the process.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
  tag_window_ = mpi_tag_window(found && tag_ub ? *tag_ub : 32767);
  check_mpi(MPI_Irecv(notice_in_.data(), static_cast<int>(notice_in_.size()), MPI_CHAR, MPI_ANY_SOURCE,
                      kAbortNoticeMpiTag, comm_, &notice_recv_),
            "MPI_Irecv (abort notices)");
}

MpiChannel::~MpiChannel() {
  std::lock_guard guard(mu_);
  release_locked(notice_recv_, Kind::Recv);
  for (auto& r : notice_sends_) release_locked(r, Kind::Send);
  auto lock = session_->lock();
  // A communicator with a collective still pending (timed out or aborted) is
  // left to MPI_Finalize: freeing it under the collective is not allowed.
  // So is an aborted one, pending or not (Note [Aborted communicators are
  // kept] in mpi_channel.h): messages may still be on their way to it.
  if (orphans_.empty() && abort_reason_.empty()) MPI_Comm_free(&comm_);
}

void MpiChannel::poll_notice_locked() {
  if (notice_recv_ == MPI_REQUEST_NULL) return;
  int done = 0;
  MPI_Status status;
  {
    auto lock = session_->lock();
    MPI_Test(&notice_recv_, &done, &status);
  }
  if (!done) return;
  int len = 0;
  MPI_Get_count(&status, MPI_CHAR, &len);
  if (abort_reason_.empty()) {
    abort_reason_ = std::string(notice_in_.data(), static_cast<std::size_t>(len > 0 ? len : 0));
    if (abort_reason_.empty()) abort_reason_ = "aborted by rank " + std::to_string(status.MPI_SOURCE);
    session_->mark_failed();  // Note [MPI_Finalize after a failure]
  }
}

std::string MpiChannel::poll_abort() {
  std::lock_guard guard(mu_);
  if (abort_reason_.empty()) poll_notice_locked();
  return abort_reason_;
}

void MpiChannel::abort(const std::string& reason) {
  std::lock_guard guard(mu_);
  if (!abort_reason_.empty()) return;
  abort_reason_ = reason.empty() ? "aborted by rank " + std::to_string(rank_) : reason;
  session_->mark_failed();  // Note [MPI_Finalize after a failure]
  notice_out_ = abort_reason_.substr(0, kNoticeBytes);
  auto lock = session_->lock();
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    MPI_Request r = MPI_REQUEST_NULL;
    // Small, so sent eagerly: it does not wait for the peer to look.
    if (MPI_Isend(notice_out_.data(), static_cast<int>(notice_out_.size()), MPI_CHAR, peer,
                  kAbortNoticeMpiTag, comm_, &r) == MPI_SUCCESS) {
      notice_sends_.push_back(r);
    }
  }
}

void MpiChannel::release(MPI_Request& request, Kind kind) {
  std::lock_guard guard(mu_);
  release_locked(request, kind);
}

void MpiChannel::release_locked(MPI_Request& request, Kind kind) {
  if (request == MPI_REQUEST_NULL) return;
  auto lock = session_->lock();
  int done = 0;
  MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  if (done) return;
  if (kind == Kind::Collective) {
    orphans_.push_back(request);
    request = MPI_REQUEST_NULL;
    return;
  }
  if (kind == Kind::Send) {
    MPI_Request_free(&request);
    return;
  }
  MPI_Cancel(&request);
  // A cancelled receive completes at once; one MPI is already filling is
  // freed instead and finishes on its own.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (!done && std::chrono::steady_clock::now() < deadline) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (!done) MPI_Request_free(&request);
  request = MPI_REQUEST_NULL;
}

}  // namespace lockstep::comm::detail
