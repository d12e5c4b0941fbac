// Private: Gloo's TCP pairs write with writev(), without MSG_NOSIGNAL, so a
// write to a peer that has died raises SIGPIPE, whose default action kills
// this process before the failure can be reported (a survivor of a killed
// rank vanished with no message). The library must not change the process's
// signal dispositions, so it blocks SIGPIPE only in the threads that write:
// for the duration of each call into Gloo from the caller's thread, and for
// good in Gloo's device thread, which inherits the mask of the thread that
// creates the device. A blocked SIGPIPE leaves the write failing with EPIPE,
// which Gloo reports as an error; one left pending in the caller's thread is
// discarded before the old mask comes back.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <ctime>

namespace lockstep::comm::gloo_backend {

class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    if (sigismember(&old_, SIGPIPE) == 1) return;  // it was blocked before: leave it to the caller
    sigset_t pending;
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);  // consume the SIGPIPE our write raised
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_{};
  sigset_t old_{};
};

}  // namespace lockstep::comm::gloo_backend
