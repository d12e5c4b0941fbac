// Waiting for one MPI request with a deadline.
//
// Note [Polling with back-off]: MPI makes progress only inside MPI calls,
// and a blocking MPI_Wait has no timeout, so wait() polls MPI_Test. Spinning
// for the whole wait would burn a core that, with ranks oversubscribed (8
// ranks on 2 cores here), the peer needs to produce the message. So the
// poll backs off:
//   1. kSpinPolls tests back to back (a message already on its way: ~us);
//   2. then std::this_thread::yield() between tests until kYieldFor has
//      passed since the wait began;
//   3. then sleeps between tests, from kFirstSleep doubling to kMaxSleep.
// The added latency is at most kMaxSleep on a wait longer than that, and
// nothing on a short one. The native all-reduce (MPI_Iallreduce) never
// sleeps, only yields: a non-blocking MPI collective advances its rounds only
// inside MPI calls, so a sleeping poller would add its sleep to every round.
// Measured: docs/design.md (the MPI backend).
//
// Note [Buffer lifetime]: a Work that ends without its request completing
// (timeout, abort, an exception unwinding past it) cancels a receive, but
// MPI cannot cancel a send: the send is freed and may still be read by MPI
// if its peer matches it later, after the caller has reused the buffer. The
// group is aborted by then (every peer hears of it at its next poll and
// posts no new receives), so at worst an aborted peer receives garbage it
// will never use. The threads backend, which can, waits for such copies.
#include "mpi_work.h"

#include <chrono>
#include <thread>

#include "lockstep/error.h"
#include "mpi_tags.h"

namespace lockstep::comm::detail {
namespace {

constexpr int kSpinPolls = 64;
constexpr auto kYieldFor = std::chrono::microseconds(200);
constexpr auto kFirstSleep = std::chrono::microseconds(10);
constexpr auto kMaxSleep = std::chrono::microseconds(500);

}  // namespace

MpiWork::~MpiWork() {
  if (request_ == MPI_REQUEST_NULL) return;
  try {
    channel_->release(request_, kind());
  } catch (...) {  // never throws
  }
}

bool MpiWork::test() const {
  if (request_ == MPI_REQUEST_NULL) return true;
  int flag = 0;
  auto lock = channel_->session().lock();
  const int rc = MPI_Test(&request_, &flag, &status_);
  if (rc != MPI_SUCCESS) {
    // With MPI_ERRORS_RETURN a failed request (e.g. truncated) reports here
    // and is complete.
    error_ = rc;
    request_ = MPI_REQUEST_NULL;
    return true;
  }
  return flag != 0;
}

bool MpiWork::done() const {
  return test();
}

std::string MpiWork::who() const {
  const std::string me = "rank " + std::to_string(channel_->rank()) + ": ";
  switch (info_.op) {
    case MpiOp::Send:
      return me + "send to rank " + std::to_string(info_.peer);
    case MpiOp::Recv:
      return me + "recv from rank " + std::to_string(info_.peer);
    case MpiOp::Allreduce:
      return me + "MPI_Iallreduce";
  }
  return me;
}

void MpiWork::check_completion() {
  const std::string what = info_.op == MpiOp::Allreduce ? info_.collective : describe_tag(info_.tag);
  if (error_ != MPI_SUCCESS) {
    int cls = 0;
    MPI_Error_class(error_, &cls);
    std::string msg = who() + " failed (" + what + "): ";
    if (cls == MPI_ERR_TRUNCATE) {
      msg = "rank " + std::to_string(channel_->rank()) + ": message from rank " + std::to_string(info_.peer) +
            " has more than the " + std::to_string(info_.bytes) + " bytes expected (" + what + ")";
    } else {
      char text[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(error_, text, &len);
      msg += std::string(text, static_cast<std::size_t>(len));
    }
    channel_->abort(msg);
    throw CommAborted(msg);
  }
  if (info_.op != MpiOp::Recv) return;
  int got = 0;
  MPI_Get_count(&status_, MPI_BYTE, &got);
  if (static_cast<std::size_t>(got) != info_.bytes) {
    const std::string msg = "rank " + std::to_string(channel_->rank()) + ": message from rank " +
                            std::to_string(info_.peer) + " has " + std::to_string(got) + " bytes where " +
                            std::to_string(info_.bytes) + " were expected (" + what + ")";
    channel_->abort(msg);
    throw CommAborted(msg);
  }
}

void MpiWork::wait(Duration timeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = deadline_after(timeout, start);
  auto pause = std::chrono::duration_cast<std::chrono::nanoseconds>(kFirstSleep);
  for (int polls = 0;; ++polls) {
    if (test()) return check_completion();
    if (const std::string reason = channel_->poll_abort(); !reason.empty()) {
      channel_->release(request_, kind());
      throw CommAborted(who() + ": communicator aborted: " + reason);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      // Built with += : GCC 12 warns falsely (-Wrestrict) on a + chain here.
      std::string msg = who();
      msg += " timed out after ";
      msg += std::to_string(timeout.count());
      msg += " ms ";
      msg += info_.op == MpiOp::Allreduce ? "in " : "(";
      msg += info_.op == MpiOp::Allreduce ? info_.collective : describe_tag(info_.tag);
      if (info_.op != MpiOp::Allreduce) msg += ")";
      channel_->release(request_, kind());
      channel_->abort(msg);
      throw TimeoutError(msg);
    }
    if (polls < kSpinPolls) continue;
    if (now - start < kYieldFor || info_.op == MpiOp::Allreduce) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::duration_cast<std::chrono::nanoseconds>(kMaxSleep));
  }
}

}  // namespace lockstep::comm::detail
