// Test helper: a redis-server of the test's own, on a free loopback port,
// spawned in a GlooGroup (which stops it when the group goes).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "gloo_group.h"

namespace lockstep::testing {

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// A socket listening on a free loopback port (written to `port`): a server
// that the test plays itself, or one that never answers.
inline int listen_on_loopback(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(fd, 16), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

inline bool accepts_connections(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

inline constexpr const char* kRedisServer = "/usr/bin/redis-server";

// Starts redis-server in `group`, logging to DIR/redis.log, and returns its
// port once it accepts connections (a test failure after 20 s). The caller
// skips the test first if kRedisServer does not exist.
inline int start_redis(GlooGroup& group, const std::filesystem::path& dir) {
  const int port = free_port();
  group.spawn_program({kRedisServer, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "",
                       "--appendonly", "no", "--dir", dir.string()},
                      "redis.log");
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!accepts_connections(port)) {
    if (std::chrono::steady_clock::now() > give_up) {
      ADD_FAILURE() << "redis-server did not start on port " << port;
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return port;
}

}  // namespace lockstep::testing
