// Test helper: run one function per rank on its own thread, under a
// wall-clock guard so that a hang fails the test instead of stalling CTest.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "lockstep/comm/threads.h"

namespace lockstep::testing {

// Runs fn(comm) for every rank of `comms`, each on its own thread. Returns
// each rank's exception (null where it returned normally). Fails the test on a hang.
inline std::vector<std::exception_ptr> run_group(
    const std::vector<std::unique_ptr<comm::Communicator>>& comms,
    const std::function<void(comm::Communicator&)>& fn,
    std::chrono::seconds guard = std::chrono::seconds(60)) {
  const int n = static_cast<int>(comms.size());
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  std::promise<void> all_done;
  auto finished = all_done.get_future();
  std::atomic<int> remaining{n};
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
      if (--remaining == 0) all_done.set_value();
    });
  }
  if (finished.wait_for(guard) != std::future_status::ready) {
    ADD_FAILURE() << "ranks did not finish within " << guard.count() << " s (hang)";
    comms[0]->abort("test guard expired");
  }
  for (auto& t : threads) t.join();
  return errors;
}

// run_group over a fresh thread group of n ranks.
inline std::vector<std::exception_ptr> run_ranks(int n, const std::function<void(comm::Communicator&)>& fn,
                                                 comm::Duration timeout = std::chrono::seconds(10),
                                                 std::chrono::seconds guard = std::chrono::seconds(60)) {
  return run_group(comm::make_thread_group({.world_size = n, .timeout = timeout}), fn, guard);
}

inline void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace lockstep::testing
