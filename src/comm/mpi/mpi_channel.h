// Private: what one MPI communicator and its pending Works share: the
// duplicated MPI communicator, the group's abort state, and the byte counts.
//
// Note [Abort over MPI]: MPI has no portable way to stop a group short of
// MPI_Abort, which kills every process of the job (and a library must not
// exit). So abort(reason) does what the threads backend does, by message:
// it marks this rank aborted and sends `reason` to every peer on a channel
// of its own (MPI tag kAbortNoticeMpiTag). Every rank keeps one receive for
// such a notice posted; every wait() polls it beside its own request, so a
// peer blocked in a collective wakes with CommAborted and the reason within
// one poll. Requests in flight are cancelled where MPI can (receives), freed
// where it cannot (sends), and left alone where MPI forbids both (a pending
// MPI_Iallreduce; the communicator is dead by then). The process then exits
// non-zero through the CLI, and mpirun tears the job down. A peer that dies
// (SIGKILL, crash) never sends a notice: mpirun sees it exit and kills the
// rest of the job (docs/errors.md has the measured times).
//
// Note [Aborted communicators are kept]: an aborted group leaves messages in
// flight: notices to peers that had already stopped listening, sends whose
// receives were cancelled or never posted. MPI_Comm_free would let OpenMPI
// reuse the communicator's context id for the next MPI_Comm_dup once every
// rank has freed it, and ob1 hands a message that arrives for a freed
// context id to the next communicator given that id, as if it were sent on
// it. It then either matches a receive there (a stale abort notice woke the
// next communicator's collective with the old reason) or, we believe, puts
// ob1's per-peer message sequence out of step, so that a later message from
// that peer is held back as out of order and never matched (an abort notice
// that never woke its peer, which then timed out: 1 run in 10 of
// MpiFailure.SizeMismatchAbortsTheGroup at -np 8, none once aborted
// communicators were kept). So the destructor never frees a communicator
// this rank saw aborted (by itself, or by a peer's notice it polled): that
// one is left to MPI_Finalize. A rank that never polled a peer's notice
// may still free it, but the aborting rank keeps it, and OpenMPI reuses a
// context id only once it is free on every rank. That costs one
// communicator per abort; a process normally exits soon after one.
#pragma once

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mpi_session.h"

namespace lockstep::comm::detail {

class MpiChannel {
 public:
  // Duplicates `parent` (collective over its ranks: MPI_Comm_idup, polled,
  // so a rank that never connects fails it with TimeoutError after
  // `timeout`) and posts the receive for abort notices.
  MpiChannel(std::shared_ptr<MpiSession> session, MPI_Comm parent, std::chrono::milliseconds timeout);
  ~MpiChannel();  // cancels what it can, frees the communicator unless aborted; never throws
  MpiChannel(const MpiChannel&) = delete;
  MpiChannel& operator=(const MpiChannel&) = delete;

  MpiSession& session() { return *session_; }
  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::uint64_t tag_window() const { return tag_window_; }

  // Why the group was aborted (here, or by a peer's notice); empty while it
  // is not. Polls for a notice.
  std::string poll_abort();
  // Marks the group aborted and sends `reason` to every peer (once).
  void abort(const std::string& reason);

  // Gets rid of a request that will never be waited for. A pending receive
  // is cancelled (waiting briefly for the cancel; freed if MPI is already
  // filling it); a pending send is freed and finishes on its own (its
  // buffer must outlive it: Note [Buffer lifetime] in mpi_work.cpp); an MPI
  // collective's request may be neither cancelled nor freed, so it is kept
  // and its communicator is left to MPI_Finalize.
  enum class Kind { Send, Recv, Collective };
  void release(MPI_Request& request, Kind kind);

  std::atomic<std::uint64_t> bytes_sent{0};
  std::atomic<std::uint64_t> bytes_received{0};
  std::atomic<std::uint64_t> messages_sent{0};

 private:
  static constexpr std::size_t kNoticeBytes = 1024;
  void poll_notice_locked();
  void release_locked(MPI_Request& request, Kind kind);

  std::shared_ptr<MpiSession> session_;  // MPI stays initialised while this lives
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::uint64_t tag_window_ = 0;

  std::mutex mu_;
  std::string abort_reason_;                    // guarded by mu_
  MPI_Request notice_recv_ = MPI_REQUEST_NULL;  // guarded by mu_
  std::array<char, kNoticeBytes> notice_in_{};  // guarded by mu_ (MPI writes it)
  std::string notice_out_;                      // guarded by mu_; read by MPI until the sends finish
  std::vector<MPI_Request> notice_sends_;       // guarded by mu_
  std::vector<MPI_Request> orphans_;            // guarded by mu_
};

}  // namespace lockstep::comm::detail
