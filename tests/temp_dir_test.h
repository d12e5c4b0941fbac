// Test helper: a fixture with a fresh, empty directory per test, removed
// afterwards. It lives under the build tree (LOCKSTEP_TEST_TMPDIR) and is
// named after the process and the test, so parallel CTest runs never share one.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace lockstep::testing {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(LOCKSTEP_TEST_TMPDIR) /
           (std::string(info->test_suite_name()) + "_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

}  // namespace lockstep::testing
