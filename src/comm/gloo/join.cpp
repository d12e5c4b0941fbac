// The join protocol (join.h): register, check the slot and the world size,
// wait for everyone, and say who is missing.
#include "join.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "build_check.h"
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

// A claim: "NONCE WORLD_SIZE HOST PID PID_SPACE BUILD". Fields are only
// ever added at the end: a build reads the fields it knows and ignores the
// rest, so builds that differ still read each other's claims far enough to
// refuse each other by name (Note [One build per group]).
struct Registration {
  std::string nonce;
  int world_size = -1;
  std::string host;
  long pid = 0;
  std::string pid_space = "?";
  std::string build;  // empty: a build from before claims stated theirs
};

Registration parse(const std::string& value) {
  Registration r;
  std::istringstream s(value);
  s >> r.nonce >> r.world_size >> r.host >> r.pid >> r.pid_space >> r.build;
  return r;
}

// Note [One build per group]: ranks of different builds may run different
// collectives at start-up (a check added, an exchange reordered), or the same
// ones with different meanings. Over the wire that shows as a collective
// mismatch or a hang, naming calls and never the cause. So each claim states
// its build (lockstep::build_id(), or what the program gave), and a rank
// refuses a group whose claims differ from its own, naming both builds,
// before any connection is made. A claim that states none is a build from
// before this check: refused too, as such. (Over MPI the build travels
// beside the processor name, in the exchange connect_mpi makes anyway.)

// A claim by a process in this boot and pid namespace that no longer exists:
// an earlier job's leftover (a rank killed during its rendezvous never
// withdraws its claim). Claims from other hosts cannot be checked: false.
bool claimed_by_exited_process(const Registration& r) {
  const std::string here = pid_space();
  return here != "?" && r.pid_space == here && r.pid > 0 && ::kill(static_cast<pid_t>(r.pid), 0) != 0 &&
         errno == ESRCH;
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

// An abort's value: the writer's wall-clock time in ms since the epoch, a
// space, the reason. The time tells an abort of the job being joined from an
// earlier job's (Note [Aborts do not outlive their job]).
std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Abort {
  std::string reason;
  double age_s = 0;
  bool age_known = true;  // false: no time, one out of range, or one over a minute ahead of this clock
};

Abort decode_abort(const std::string& value) {
  const std::size_t space = value.find(' ');
  char* end = nullptr;
  errno = 0;
  const long long t = space == std::string::npos ? 0 : std::strtoll(value.c_str(), &end, 10);
  if (space == std::string::npos || end != value.c_str() + space || errno == ERANGE || t < 0) {
    return {value, 0, false};  // not ours: the reason as is, of no known age
  }
  // In double: a time near the range's ends must not overflow. A clock a
  // little ahead (hosts sharing a store) reads as just now; a minute or more
  // ahead is no time this job can trust, and must not make the record
  // "fresh" for good (Note [Aborts do not outlive their job]).
  const double age_s = (double(wall_ms()) - double(t)) / 1000.0;
  return {value.substr(space + 1), std::max(0.0, age_s), age_s > -60.0};
}

void write_abort(RendezvousStore& store, const std::string& key, const std::string& reason) noexcept {
  if (store.unresponsive()) return;  // it would wait the whole timeout again; peers see broken connections
  const ScopedSigpipeBlock no_sigpipe;
  try {
    store.set_if_absent(key, std::to_string(wall_ms()) + " " + reason);
  } catch (...) {  // the store is gone: the peers learn of the abort from their broken connections
  }
}

// Note [A rank that gave up]: a rank whose join times out writes no abort
// (the others time out too, and an abort would stop a job restarted at once:
// Note [Aborts do not outlive their job]). But a rank held up past its own
// deadline (stopped by SIGSTOP or a debugger, a paused machine) finds, once
// it runs again, no claim of a rank that had joined and gave up meanwhile,
// and would say that rank "has not joined". So a rank that times out records
// "gave_up/<rank>" = "<wall ms>" (a new claim of that rank removes it), and a
// rank that times out names those that gave up after it began its own join
// as such. A record older than that may be an earlier job's: it is said
// beside "has not joined", as "gave up waiting N s before this rank began".
// The times are wall clocks, compared across hosts sharing a store: clocks
// that disagree by more than the gap move a record from one kind to the
// other, which is why the second says "if that was this job".
std::string gave_up_key(int rank) {
  return "gave_up/" + std::to_string(rank);
}

void write_gave_up(RendezvousStore& store, int rank) noexcept {
  store.remove(gave_up_key(rank));
  write_abort(store, gave_up_key(rank), "gave up");  // "<wall ms> gave up"
}

// When rank `rank` last gave up waiting, in wall ms; 0 if no record says.
long long gave_up_at(RendezvousStore& store, int rank) {
  const auto record = store.try_get(gave_up_key(rank));
  return record ? std::max(0LL, std::strtoll(record->c_str(), nullptr, 10)) : 0;
}

}  // namespace

std::string gave_up_since(RendezvousStore& store, std::vector<int>& ranks, long long since_ms, int world_size,
                          const std::string& done) {
  std::vector<int> gave_up, others;
  long long latest = 0;
  for (int i : ranks) {
    const long long at = gave_up_at(store, i);
    if (at >= since_ms && at > 0)
      gave_up.push_back(i), latest = std::max(latest, at);
    else
      others.push_back(i);
  }
  ranks = others;
  if (gave_up.empty()) return "";
  const bool one = gave_up.size() == 1;
  char ago[32];
  std::snprintf(ago, sizeof ago, "%.0f s ago", std::max(0.0, double(wall_ms() - latest) / 1000.0));
  return std::string(one ? "rank " : "ranks ") + rank_list(gave_up) + " of " + std::to_string(world_size) +
         " " + done + " and gave up waiting " + (one ? "" : "(the last ") + ago +
         (one ? ", its" : "; their") + " --rendezvous-timeout ran out" + (one ? "" : ")") +
         " while this rank was held up past its own deadline " +
         "(stopped, by SIGSTOP or a debugger, or on a paused machine): start every rank again";
}

namespace {

// True if some rank of [0, world_size) holds a claim. Errors count as claims:
// nothing is removed on a guess.
bool any_claim(RendezvousStore& store, int world_size) noexcept {
  try {
    for (int i = 0; i < world_size; ++i) {
      const auto v = store.try_get("rank/" + std::to_string(i));
      if (v && !claimed_by_exited_process(parse(*v))) return true;  // an exited process's claim holds no one
    }
    return false;
  } catch (...) {
    return true;
  }
}

// The last claimant out removes "world_size". The "abort" stays for ranks of
// the same job still on their way, until it is kAbortFreshFor old.
void sweep_if_last(RendezvousStore& store, int world_size) noexcept {
  if (any_claim(store, world_size)) return;
  store.remove("world_size");
}

}  // namespace

// All run after a failure, from any thread, and a Redis store writes to its
// socket (hiredis, no MSG_NOSIGNAL): a lost Redis connection must not kill
// the process with SIGPIPE before the failure is reported (sigpipe.h).
void publish_abort(RendezvousStore& store, const std::string& reason) noexcept {
  write_abort(store, store.abort_key(), reason);
}

bool claim_holder_exited(RendezvousStore& store, int rank) noexcept {
  const ScopedSigpipeBlock no_sigpipe;
  try {
    const auto v = store.try_get("rank/" + std::to_string(rank));
    return v && claimed_by_exited_process(parse(*v));
  } catch (...) {
    return false;  // a store that does not answer: the caller's deadline decides
  }
}

std::optional<std::string> read_abort(RendezvousStore& store) noexcept {
  const ScopedSigpipeBlock no_sigpipe;
  try {
    const auto value = store.try_get(store.abort_key());
    if (!value) return std::nullopt;
    return decode_abort(*value).reason;
  } catch (...) {
    return std::nullopt;
  }
}

void throw_if_aborted(RendezvousStore& store, int rank) {
  const auto value = store.try_get(store.abort_key());
  if (!value) return;
  const Abort a = decode_abort(*value);
  const std::string prefix = "rank " + std::to_string(rank) + ": ";
  char age[96] = "";
  if (a.age_s >= 1) {  // perhaps an earlier job's: say when
    std::snprintf(age, sizeof age, " (recorded %.0f s ago)", a.age_s);
  }
  if (a.reason.rfind(kRefused, 0) == 0) throw InvalidArgument(prefix + a.reason + age);
  throw CommAborted(prefix + "the group was aborted during rendezvous: " + a.reason + age);
}

void leave(RendezvousStore& store, int rank, int world_size) noexcept {
  // A store that stopped answering gets no clean-up calls (each would wait
  // the whole timeout); the claim left is taken over by the next job's rank
  // on this host (join_claimed).
  if (store.unresponsive()) return;
  store.remove("rank/" + std::to_string(rank));
  store.remove("addr/" + std::to_string(rank));
  sweep_if_last(store, world_size);
}

void leave_timed_out(RendezvousStore& store, int rank, int world_size) noexcept {
  if (store.unresponsive()) return;
  write_gave_up(store, rank);
  leave(store, rank, world_size);
}

void leave_failed(RendezvousStore& store, int rank, int world_size, const std::string& reason) noexcept {
  publish_abort(store, reason);
  write_abort(store, "abort", reason);
  leave(store, rank, world_size);
}

namespace {

std::vector<std::string> join_claimed(RendezvousStore& store, int rank, int world_size,
                                      std::chrono::milliseconds timeout, Clock::time_point deadline,
                                      const std::string& nonce, const std::string& build) {
  const std::string where = "rendezvous " + store.address();
  const std::string me = "rank " + std::to_string(rank);

  // 1. Claim the rank.
  const std::string mine = nonce + " " + std::to_string(world_size) + " " + hostname() + " " +
                           std::to_string(::getpid()) + " " + pid_space() + " " + build;
  const std::string rank_key = "rank/" + std::to_string(rank);
  store.set_if_absent(rank_key, mine);
  auto held = store.try_get(rank_key);
  if (held && parse(*held).nonce != nonce && claimed_by_exited_process(parse(*held))) {
    // An earlier job's rank here was killed during its rendezvous (Ctrl-C):
    // its claim would refuse every later job with this id. Its process is
    // gone, so this rank takes the claim over. (Waiting ranks do not count
    // such a claim as joined, below.)
    // Its addresses too, if it got that far: peers read them only once
    // every claim is there, so none reads them before this one is ours.
    store.remove("addr/" + std::to_string(rank));
    store.remove(rank_key);
    store.set_if_absent(rank_key, mine);
    held = store.try_get(rank_key);
  }
  if (!held || parse(*held).nonce != nonce) {
    const Registration other = held ? parse(*held) : Registration{};
    const std::string here = pid_space();
    if (here != "?" && other.pid_space == here) {  // checked: that process is running
      refuse(store, where + ": " + me + " was claimed twice (also by pid " + std::to_string(other.pid) +
                        " on " + other.host + ", still running); every process needs its own rank");
    }
    // Another host's claim (or one whose process this host cannot check):
    // a live process's, or one left by an earlier job killed during its
    // rendezvous there; the store cannot tell which.
    refuse(store,
           where + ": " + me + " is already claimed by pid " + std::to_string(other.pid) + " on " +
               other.host + ", which this host cannot check. If that process runs, every process " +
               "needs its own rank; if it was an earlier job that died there, use a fresh rendezvous " +
               "directory or another job id");
  }

  // This rank's number is joining anew: a record that an earlier holder of it
  // gave up waiting (Note [A rank that gave up]) is about a group gone.
  store.remove(gave_up_key(rank));

  // 2. Agree on the world size.
  // "N R NONCE": the size, and the rank and claim that set it.
  const std::string world_value = std::to_string(world_size) + " " + std::to_string(rank) + " " + nonce;
  store.set_if_absent("world_size", world_value);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const auto ws = store.try_get("world_size");
    if (!ws) break;
    std::istringstream s(*ws);
    int n = -1, by = -1;
    std::string by_nonce;
    s >> n >> by >> by_nonce;
    if (n == world_size) break;
    // Set by a claim that is no longer there (its rank left, or was taken
    // over from an exited process): an earlier job's, killed before its last
    // rank could remove it. Set it anew, once. A live rank's value is never
    // removed: its claim still holds the nonce.
    const auto by_claim = by >= 0 ? store.try_get("rank/" + std::to_string(by)) : std::nullopt;
    const bool stale =
        !by_claim || parse(*by_claim).nonce != by_nonce || claimed_by_exited_process(parse(*by_claim));
    if (attempt == 0 && stale) {
      store.remove("world_size");
      store.set_if_absent("world_size", world_value);
      continue;
    }
    refuse(store, where + ": " + me + " was started with world size " + std::to_string(world_size) +
                      " but rank " + std::to_string(by) + " with world size " + std::to_string(n));
  }

  // 3. Wait for everyone.
  std::vector<bool> joined(world_size, false);
  std::vector<std::string> hosts(world_size), nonces(world_size);
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
      if (claimed_by_exited_process(other)) {  // an earlier job's: its rank has not joined this one
        missing.push_back(i);
        continue;
      }
      if (other.world_size != world_size) {
        refuse(store, where + ": rank " + std::to_string(i) + " was started with world size " +
                          std::to_string(other.world_size) + " but " + me + " with world size " +
                          std::to_string(world_size));
      }
      if (other.build != build) {
        const std::string msg =
            where + ": " +
            detail::build_mismatch("rank " + std::to_string(i) + " (pid " + std::to_string(other.pid) +
                                       " on " + other.host + ")",
                                   other.build, me, build);
        // An older rank past its join polls the session's key alone (join.h).
        if (const auto first = store.try_get("rank/0"))
          write_abort(store, "abort/" + parse(*first).nonce, kRefused + msg);
        refuse(store, msg);
      }
      joined[i] = true;
      hosts[i] = other.host;
      nonces[i] = other.nonce;
    }
    if (missing.empty()) {
      // A rank that failed meanwhile withdrew its claim (or another process
      // took the rank): everyone must still be there, as seen, to go on.
      for (int i = 0; i < world_size; ++i) {
        const auto v = store.try_get("rank/" + std::to_string(i));
        if (!v || parse(*v).nonce != nonces[i]) joined[i] = false, missing.push_back(i);
      }
    }
    if (missing.empty() && nonces[rank] != nonce) {
      // Another process took this rank after this one claimed it (two
      // duplicates both taking over an exited process's claim).
      refuse(store, where + ": " + me + " was claimed twice (also by another process since); every process " +
                        "needs its own rank");
    }
    if (missing.empty()) {
      store.set_session(nonces[0]);  // every rank read the same claim of rank 0
      return hosts;
    }
    throw_if_aborted(store, rank);
    if (Clock::now() >= deadline) {
      // Note [A rank that gave up]: of the missing, those that had joined
      // and gave up since this rank began, while it was held up.
      const auto began =
          wall_ms() -
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - (deadline - timeout)).count();
      std::vector<int> absent = missing;
      const std::string gave_up = gave_up_since(store, absent, began, world_size, "had joined");
      // Absent, but gave up before this rank began: perhaps this job, perhaps an earlier one.
      std::vector<int> before;
      long long latest = 0;
      for (int i : absent) {
        if (const long long at = gave_up_at(store, i); at > 0)
          before.push_back(i), latest = std::max(latest, at);
      }
      std::string msg = where + ": " + me + " timed out after " + std::to_string(timeout.count()) +
                        " ms waiting for the group: ";
      if (!absent.empty()) {
        msg += std::string("rank") + (absent.size() > 1 ? "s " : " ") + rank_list(absent) + " of " +
               std::to_string(world_size) + (absent.size() > 1 ? " have" : " has") +
               " not joined (every rank " + "needs this rendezvous and job id '" + store.job_id() +
               "' (--job-id); one slow to start needs " + "a longer --rendezvous-timeout)";
      }
      if (!before.empty()) {
        char when[32];
        std::snprintf(when, sizeof when, "%.0f s", double(began - latest) / 1000.0);
        msg += std::string("; rank") + (before.size() > 1 ? "s " : " ") + rank_list(before) +
               " of a job with " + "this id gave up waiting " + (before.size() > 1 ? "the last " : "") +
               when + " before this rank " +
               "began (if that was this job, this rank started too late: start every rank again)";
      }
      if (!gave_up.empty()) msg += (absent.empty() ? "" : "; ") + gave_up;
      throw TimeoutError(msg);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

std::vector<std::string> join(RendezvousStore& store, int rank, int world_size,
                              std::chrono::milliseconds timeout, Clock::time_point deadline,
                              const std::string& build) {
  // An "abort" with no claimant left, older than a job's ranks take to
  // arrive, is an earlier job's (Note [Aborts do not outlive their job]).
  if (const auto value = store.try_get("abort")) {
    const Abort a = decode_abort(*value);
    if ((!a.age_known || a.age_s > double(kAbortFreshFor.count())) && !any_claim(store, world_size)) {
      store.remove("abort");
      store.remove("world_size");
    }
  }
  throw_if_aborted(store, rank);
  const std::string nonce = make_nonce();
  try {
    return join_claimed(store, rank, world_size, timeout, deadline, nonce, build);
  } catch (const std::exception& e) {
    // A store that stopped answering gets no clean-up calls: each would wait
    // the whole timeout again (four of them took 4x the timeout). The claim
    // left behind is taken over by the next job's rank on this host (above).
    if (store.unresponsive()) throw;
    // Peers waiting in the join stop at once, unless it ran out of time (so
    // do they) or a refusal already said why (first writer wins).
    if (dynamic_cast<const TimeoutError*>(&e) == nullptr)
      publish_abort(store, e.what());
    else
      write_gave_up(store, rank);
    const ScopedSigpipeBlock no_sigpipe;
    const std::string rank_key = "rank/" + std::to_string(rank);
    try {
      const auto held = store.try_get(rank_key);
      if (held && parse(*held).nonce == nonce) store.remove(rank_key);  // ours, not a duplicate's
    } catch (...) {
    }
    sweep_if_last(store, world_size);
    throw;
  }
}

}  // namespace lockstep::comm::gloo_backend
