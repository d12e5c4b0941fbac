// The join protocol (join.h): register, check the slot and the world size,
// wait for everyone, and say who is missing.
#include "join.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "lockstep/error.h"
#include "sigpipe.h"

namespace lockstep::comm::gloo_backend {
namespace {

// Prefix of an abort reason written by a refused join: peers rethrow it as InvalidArgument.
constexpr const char* kRefused = "rendezvous refused: ";

std::string make_nonce() {
  std::random_device rd;
  std::ostringstream s;
  s << std::hex << rd() << rd() << rd() << rd();
  return s.str();
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

// Where this process's pid means something: the kernel's boot id and the
// pid namespace. Two processes with the same host name (containers, clones of
// one image) or in different pid namespaces get different values, so a pid is
// only looked up where it is the same process. "?" when either is unreadable.
std::string pid_space() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat ns {};
  if (boot.empty() || ::stat("/proc/self/ns/pid", &ns) != 0) return "?";
  return boot + ":" + std::to_string(ns.st_dev) + ":" + std::to_string(ns.st_ino);  // namespaces(7)
}

struct Registration {
  std::string nonce;
  int world_size = -1;
  std::string host;
  long pid = 0;
  std::string pid_space = "?";
};

Registration parse(const std::string& value) {
  Registration r;
  std::istringstream s(value);
  s >> r.nonce >> r.world_size >> r.host >> r.pid >> r.pid_space;
  return r;
}

[[noreturn]] void refuse(RendezvousStore& store, const std::string& msg) {
  publish_abort(store, kRefused + msg);
  throw InvalidArgument(msg);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

// Both run after a failure, from any thread, and a Redis store writes to its
// socket (hiredis, no MSG_NOSIGNAL): a lost Redis connection must not kill
// the process with SIGPIPE before the failure is reported (sigpipe.h).
void publish_abort(RendezvousStore& store, const std::string& reason) noexcept {
  const ScopedSigpipeBlock no_sigpipe;
  try {
    store.set_if_absent(kAbortKey, reason);
  } catch (...) {  // the store is gone: the peers learn of the abort from their broken connections
  }
}

std::optional<std::string> read_abort(RendezvousStore& store) noexcept {
  const ScopedSigpipeBlock no_sigpipe;
  try {
    return store.try_get(kAbortKey);
  } catch (...) {
    return std::nullopt;
  }
}

void throw_if_aborted(RendezvousStore& store, int rank) {
  const auto reason = store.try_get(kAbortKey);
  if (!reason) return;
  const std::string prefix = "rank " + std::to_string(rank) + ": ";
  if (reason->rfind(kRefused, 0) == 0) throw InvalidArgument(prefix + *reason);
  throw CommAborted(prefix + "the group was aborted during rendezvous: " + *reason);
}

void leave(RendezvousStore& store, int rank) {
  store.remove("rank/" + std::to_string(rank));
  store.remove("addr/" + std::to_string(rank));
  if (rank == 0) store.remove("world_size");
}

void join(RendezvousStore& store, int rank, int world_size, std::chrono::milliseconds timeout,
          Clock::time_point deadline) {
  const std::string where = "rendezvous " + store.address();
  const std::string me = "rank " + std::to_string(rank);
  throw_if_aborted(store, rank);

  // 1. Claim the rank.
  const std::string nonce = make_nonce();
  const std::string mine =
      nonce + " " + std::to_string(world_size) + " " + hostname() + " " + std::to_string(::getpid()) + " " +
      pid_space();
  const std::string rank_key = "rank/" + std::to_string(rank);
  store.set_if_absent(rank_key, mine);
  const auto held = store.try_get(rank_key);
  if (!held || parse(*held).nonce != nonce) {
    const Registration other = held ? parse(*held) : Registration{};
    // A claim by a process in this boot and pid namespace that no longer
    // exists: an earlier job's leftover.
    const std::string here = pid_space();
    const bool exited = here != "?" && other.pid_space == here && other.pid > 0 && ::kill(other.pid, 0) != 0 &&
                        errno == ESRCH;
    if (exited) {
      refuse(store, where + ": " + me + " is still claimed by pid " + std::to_string(other.pid) + " on " +
                        other.host + ", which has exited: an earlier job left it. Use a fresh rendezvous " +
                        "directory or another job id");
    }
    refuse(store, where + ": " + me + " was claimed twice (also by pid " + std::to_string(other.pid) +
                      " on " + other.host + "); every process needs its own rank. If that was an " +
                      "earlier job, use a fresh rendezvous directory or another job id");
  }

  // 2. Agree on the world size.
  store.set_if_absent("world_size", std::to_string(world_size) + " " + std::to_string(rank));
  if (const auto ws = store.try_get("world_size")) {
    std::istringstream s(*ws);
    int n = -1, by = -1;
    s >> n >> by;
    if (n != world_size) {
      refuse(store, where + ": " + me + " was started with world size " + std::to_string(world_size) +
                        " but rank " + std::to_string(by) + " with world size " + std::to_string(n));
    }
  }

  // 3. Wait for everyone.
  std::vector<bool> joined(world_size, false);
  for (;;) {
    std::vector<int> missing;
    for (int i = 0; i < world_size; ++i) {
      if (joined[i]) continue;
      const auto v = store.try_get("rank/" + std::to_string(i));
      if (!v) {
        missing.push_back(i);
        continue;
      }
      const Registration other = parse(*v);
      if (other.world_size != world_size) {
        refuse(store, where + ": rank " + std::to_string(i) + " was started with world size " +
                          std::to_string(other.world_size) + " but " + me + " with world size " +
                          std::to_string(world_size));
      }
      joined[i] = true;
    }
    if (missing.empty()) return;
    throw_if_aborted(store, rank);
    if (Clock::now() >= deadline) {
      throw TimeoutError(where + ": " + me + " timed out after " + std::to_string(timeout.count()) +
                         " ms waiting for the group: rank" + (missing.size() > 1 ? "s " : " ") +
                         rank_list(missing) + " of " + std::to_string(world_size) +
                         (missing.size() > 1 ? " have" : " has") + " not joined");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace lockstep::comm::gloo_backend
