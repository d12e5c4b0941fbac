// Kill tests over the Gloo backend: one rank (rank 0, or another) is
// SIGKILLed before, during and after an all-reduce, and during rendezvous.
// Every survivor must exit within timeout + 5 s with an error naming the dead
// rank (and, once the group is up, the collective's sequence number).
#include <gtest/gtest.h>

#include "comm/gloo/store.h"
#include "gloo_group.h"
#include "temp_dir_test.h"

namespace lockstep::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kWorld = 4;
constexpr auto kTimeout = 2s;  // --timeout-ms of every rank
constexpr auto kBound = kTimeout + 5s;

enum class Phase { Before, During, After, Rendezvous };

std::string phase_name(Phase p) {
  switch (p) {
    case Phase::Before:
      return "before";
    case Phase::During:
      return "during";
    case Phase::After:
      return "after";
    case Phase::Rendezvous:
      return "rendezvous";
  }
  return "?";
}

struct KillCase {
  Phase phase;
  int victim;
};

class GlooKill : public TempDirTest, public ::testing::WithParamInterface<KillCase> {
 protected:
  std::vector<std::string> args(const std::string& scenario,
                                const std::string& rendezvous_ms = "30000") const {
    return {"--world-size",
            std::to_string(kWorld),
            "--rendezvous",
            "file:" + (dir_ / "rdv").string(),
            "--scenario",
            scenario,
            "--dir",
            dir_.string(),
            "--timeout-ms",
            std::to_string(std::chrono::milliseconds(kTimeout).count()),
            "--rendezvous-timeout-ms",
            rendezvous_ms};
  }
};

std::vector<int> all_ranks() {
  std::vector<int> r(kWorld);
  for (int i = 0; i < kWorld; ++i) r[i] = i;
  return r;
}

TEST_P(GlooKill, EverySurvivorExitsInTimeNamingTheDeadRank) {
  const auto [phase, victim] = GetParam();
  GlooGroup group(dir_);
  std::vector<int> index(kWorld, -1);  // rank -> index in group
  std::chrono::steady_clock::time_point killed_at;

  if (phase == Phase::Rendezvous) {
    // The victim joins alone and is killed while it waits for the others,
    // who then find it registered but never hear from it again.
    index[victim] = group.spawn(victim, args("allreduce", "2000"));
    comm::gloo_backend::RendezvousStore store("file:" + (dir_ / "rdv").string(), "lockstep");
    const auto give_up = std::chrono::steady_clock::now() + 30s;
    while (!store.try_get("rank/" + std::to_string(victim))) {
      ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "the victim never joined";
      std::this_thread::sleep_for(5ms);
    }
    group.kill(index[victim]);
    killed_at = std::chrono::steady_clock::now();
    for (int r = 0; r < kWorld; ++r)
      if (r != victim) index[r] = group.spawn(r, args("allreduce", "2000"));
  } else {
    const char* scenario = phase == Phase::Before ? "hold" : phase == Phase::During ? "loop" : "after";
    const char* mark = phase == Phase::Before ? "connected" : phase == Phase::During ? "looping" : "reduced";
    for (int r = 0; r < kWorld; ++r) index[r] = group.spawn(r, args(scenario));
    ASSERT_TRUE(group.wait_for_marks(mark, all_ranks(), 40s)) << "the group did not get going";
    group.kill(index[victim]);
    killed_at = std::chrono::steady_clock::now();
    group.go();
  }

  const auto exits = group.wait_all(40s);
  EXPECT_EQ(exits[index[victim]].signal, SIGKILL);
  const std::string dead = "rank " + std::to_string(victim);
  for (int r = 0; r < kWorld; ++r) {
    if (r == victim) continue;
    const RankExit& e = exits[index[r]];
    EXPECT_TRUE(e.code == 3 || e.code == 4) << "rank " << r << " exit " << e.code << " signal " << e.signal
                                              << ":\n" << e.log;
    EXPECT_LE(e.ended - killed_at, kBound) << "rank " << r << " took too long:\n" << e.log;
    if (phase == Phase::Rendezvous) {
      EXPECT_NE(e.log.find(dead), std::string::npos) << "rank " << r << ":\n" << e.log;
    } else {
      EXPECT_NE(e.log.find("connection to " + dead + " "), std::string::npos) << "rank " << r << ":\n"
                                                                              << e.log;
      EXPECT_NE(e.log.find(", seq "), std::string::npos) << "rank " << r << ":\n" << e.log;
    }
  }
}

// Note [Watching for aborts]: a rank whose only pending transfer is with a
// rank that is alive but silent is not woken by any broken connection when a
// third rank aborts; it reads the abort from the store within ~100 ms instead
// of sleeping to its 20 s timeout, or to rank 0's exit after 4 s.
class GlooWatch : public TempDirTest {};

TEST_F(GlooWatch, ARankWaitingOnASilentPeerLearnsOfAnAbortFromTheStore) {
  GlooGroup group(dir_);
  std::vector<std::string> a = {"--world-size", "3", "--rendezvous", "file:" + (dir_ / "rdv").string(),
                                "--scenario", "watch", "--dir", dir_.string(), "--timeout-ms", "20000"};
  for (int r = 0; r < 3; ++r) group.spawn(r, a);
  ASSERT_TRUE(group.wait_for_marks("connected", {0, 1, 2}, 40s)) << "the group did not get going";
  const auto go = std::chrono::steady_clock::now();
  group.go();
  const auto exits = group.wait_all(40s);
  const RankExit& waiter = exits[2];
  EXPECT_EQ(waiter.code, 3) << waiter.log;
  EXPECT_NE(waiter.log.find("stopped on purpose (watch test)"), std::string::npos) << waiter.log;
  EXPECT_LT(waiter.ended - go, 3s) << "not woken by the abort:\n" << waiter.log;
}

INSTANTIATE_TEST_SUITE_P(Processes, GlooKill,
                         ::testing::Values(KillCase{Phase::Before, 0}, KillCase{Phase::Before, 2},
                                           KillCase{Phase::During, 0}, KillCase{Phase::During, 2},
                                           KillCase{Phase::After, 0}, KillCase{Phase::After, 2},
                                           KillCase{Phase::Rendezvous, 0}, KillCase{Phase::Rendezvous, 2}),
                         [](const auto& info) {
                           return phase_name(info.param.phase) + "_rank" + std::to_string(info.param.victim);
                         });

}  // namespace
}  // namespace lockstep::testing
