// The rendezvous store under contention: every rank of a job sets the same
// keys ("world_size", "abort") at about the same moment, each through its own
// store, as separate processes do. Exactly one writer must win, and every
// reader must see the winner's whole value, never an empty or torn file.
#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo/store.h"
#include "lockstep/error.h"
#include "redis_server.h"
#include "temp_dir_test.h"

namespace lockstep::testing {
namespace {

using comm::gloo_backend::RendezvousStore;

class GlooStore : public TempDirTest {};

// 8 writers, each with its own store, set the same 100 keys at once.
void race_on_keys(const std::string& address) {
  constexpr int kWriters = 8;
  constexpr int kKeys = 100;
  // A long value per writer, so a torn or truncated file cannot pass for a whole one.
  auto value_of = [](int w) { return std::to_string(w) + ":" + std::string(4096 + 97 * w, char('a' + w)); };

  std::vector<std::vector<bool>> won(kWriters, std::vector<bool>(kKeys, false));
  std::vector<std::vector<std::optional<std::string>>> seen(
      kWriters, std::vector<std::optional<std::string>>(kKeys));
  std::vector<std::string> errors(kWriters);
  std::atomic<int> ready{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      try {
        RendezvousStore store(address, "job");  // one store per writer, like one per process
        ready.fetch_add(1);
        while (ready.load() < kWriters) std::this_thread::yield();
        for (int k = 0; k < kKeys; ++k) {
          const std::string key = "contended/" + std::to_string(k);
          won[w][k] = store.set_if_absent(key, value_of(w));
          seen[w][k] = store.try_get(key);
        }
      } catch (const std::exception& e) {
        errors[w] = e.what();
      }
    });
  }
  for (auto& t : writers) t.join();

  for (int w = 0; w < kWriters; ++w) ASSERT_EQ(errors[w], "") << "writer " << w;
  for (int k = 0; k < kKeys; ++k) {
    int winners = 0, winner = -1;
    for (int w = 0; w < kWriters; ++w) {
      if (won[w][k]) ++winners, winner = w;
    }
    ASSERT_EQ(winners, 1) << "key " << k;
    for (int w = 0; w < kWriters; ++w) {
      ASSERT_TRUE(seen[w][k].has_value()) << "key " << k << ", writer " << w;
      ASSERT_EQ(*seen[w][k], value_of(winner)) << "key " << k << ", writer " << w << " read a value "
                                               << seen[w][k]->size() << " bytes long";
    }
  }
}

TEST_F(GlooStore, SetIfAbsentHasExactlyOneWinnerAndNoTornValue) {
  race_on_keys("file:" + (dir_ / "rdv").string());
}

// The same over Redis's SETNX. Every lost race used to leak Gloo's reply
// object (LeakSanitizer failed the ASan stage); set_if_absent now frees it.
TEST_F(GlooStore, RedisSetIfAbsentHasExactlyOneWinner) {
  if (!std::filesystem::exists(kRedisServer)) {
    GTEST_SKIP() << "redis-server is not installed (scripts/setup.sh installs it)";
  }
  GlooGroup redis(dir_);
  const int port = start_redis(redis, dir_);
  ASSERT_NE(port, 0);
  race_on_keys("redis://127.0.0.1:" + std::to_string(port));
}

// A "Redis server" that accepts connections (the kernel completes them on a
// listening socket) and never answers, as a stopped or overloaded one does:
// every store call fails within the store's timeout instead of blocking.
// Wall-clock guard, not a timing threshold: a hang fails the test.
TEST_F(GlooStore, ARedisServerThatNeverAnswersFailsEveryCallWithinTheTimeout) {
  int port = 0;
  const int fd = listen_on_loopback(port);
  const std::string address = "redis://127.0.0.1:" + std::to_string(port);
  const auto t0 = std::chrono::steady_clock::now();
  RendezvousStore store(address, "job", std::chrono::milliseconds(300));
  try {
    store.set_if_absent("k", "v");
    ADD_FAILURE() << "a silent server answered";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("did not answer within 300 ms"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
  }
  EXPECT_THROW(store.try_get("k"), IoError);  // a new connection, just as silent
  store.remove("k");                          // never throws; blocks at most the timeout
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "blocked past the timeout";
  ::close(fd);
}

// After a timeout the store connects again on its next call: a Redis server
// that was stopped (SIGSTOP) and then continued serves the same store. Without
// the reconnect, the timed-out connection stays dead (hiredis keeps its error)
// and every later call fails, so the abort watcher and the clean-up at exit
// would stop working after one slow moment of the server.
TEST_F(GlooStore, ARedisStoreConnectsAgainAfterATimeout) {
  if (!std::filesystem::exists(kRedisServer)) {
    GTEST_SKIP() << "redis-server is not installed (scripts/setup.sh installs it)";
  }
  GlooGroup redis(dir_);
  const int port = start_redis(redis, dir_);
  ASSERT_NE(port, 0);
  const pid_t server = redis.pids().at(0);
  RendezvousStore store("redis://127.0.0.1:" + std::to_string(port), "job", std::chrono::milliseconds(300));
  ASSERT_TRUE(store.set_if_absent("before", "1"));

  ASSERT_EQ(::kill(server, SIGSTOP), 0);
  EXPECT_THROW(store.set_if_absent("during", "2"), IoError);
  ASSERT_EQ(::kill(server, SIGCONT), 0);

  // The stopped server still answers the timed-out SETNX once it runs again;
  // a reused connection would read that late reply as the answer to the next
  // command. A new connection reads only its own.
  EXPECT_EQ(store.try_get("before").value_or("absent"), "1");
  EXPECT_TRUE(store.set_if_absent("after", "3"));
  EXPECT_EQ(store.try_get("after").value_or("absent"), "3");
  store.remove("after");
  EXPECT_FALSE(store.try_get("after").has_value());
}

TEST_F(GlooStore, RemovedKeyReadsAsAbsentAndCanBeSetAgain) {
  RendezvousStore store("file:" + (dir_ / "rdv").string(), "job");
  EXPECT_FALSE(store.try_get("k").has_value());
  EXPECT_TRUE(store.set_if_absent("k", "one"));
  EXPECT_FALSE(store.set_if_absent("k", "two"));
  EXPECT_EQ(store.try_get("k").value_or(""), "one");
  store.remove("k");
  EXPECT_FALSE(store.try_get("k").has_value());
  EXPECT_TRUE(store.set_if_absent("k", "three"));
  EXPECT_EQ(store.try_get("k").value_or(""), "three");
}

}  // namespace
}  // namespace lockstep::testing
