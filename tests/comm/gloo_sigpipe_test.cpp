// The SIGPIPE guard of the Gloo backend (comm/gloo/sigpipe.h). Gloo writes
// with writev(), so a write to a dead peer raises SIGPIPE, which killed
// survivors of a killed rank (GlooKill "during" cases, signal 13, about one
// run in ten on a loaded machine). Here the guard meets a socket whose peer
// has closed, which raises SIGPIPE on every write.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "comm/gloo/sigpipe.h"

namespace lockstep::testing {
namespace {

using comm::gloo_backend::ScopedSigpipeBlock;

bool sigpipe_blocked_here() {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, SIGPIPE) == 1;
}

bool sigpipe_pending_here() {
  sigset_t pending;
  sigpending(&pending);
  return sigismember(&pending, SIGPIPE) == 1;
}

TEST(GlooSigpipe, AWriteToAClosedPeerFailsWithEpipeAndTheMaskComesBack) {
  ASSERT_FALSE(sigpipe_blocked_here());
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ::close(fds[1]);
  {
    const ScopedSigpipeBlock guard;
    const char byte = 1;
    errno = 0;
    EXPECT_EQ(::write(fds[0], &byte, 1), -1);  // without the guard, SIGPIPE ends the test binary here
    EXPECT_EQ(errno, EPIPE);
    EXPECT_TRUE(sigpipe_pending_here());
  }
  EXPECT_FALSE(sigpipe_blocked_here()) << "the caller's mask was not restored";
  EXPECT_FALSE(sigpipe_pending_here()) << "the SIGPIPE the write raised was left pending";
  ::close(fds[0]);
}

TEST(GlooSigpipe, AThreadStartedUnderTheGuardKeepsItBlocked) {
  bool blocked_in_thread = false;
  {
    const ScopedSigpipeBlock guard;  // as when Gloo's device starts its event loop
    std::thread([&] { blocked_in_thread = sigpipe_blocked_here(); }).join();
  }
  EXPECT_TRUE(blocked_in_thread);
  EXPECT_FALSE(sigpipe_blocked_here());
}

TEST(GlooSigpipe, AnAlreadyBlockedSigpipeStaysBlocked) {
  sigset_t pipe, old;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &old);
  { const ScopedSigpipeBlock guard; }
  EXPECT_TRUE(sigpipe_blocked_here());
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

}  // namespace
}  // namespace lockstep::testing
