// The job secret over the Gloo backend: a rank with the wrong secret is
// refused (its address logged), a secret file others can read is refused,
// and a raw TCP client sending garbage to the ranks' ports does not disturb
// the job.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <filesystem>
#include <random>
#include <set>

#include "gloo_group.h"
#include "temp_dir_test.h"

namespace lockstep::testing {
namespace {

using namespace std::chrono_literals;

class GlooSecret : public TempDirTest {
 protected:
  std::string secret(const std::string& name, const std::string& contents, mode_t mode = 0600) const {
    const auto path = (dir_ / name).string();
    std::ofstream(path) << contents;
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::vector<std::string> args(int world_size, const std::string& scenario = "allreduce") const {
    return {"--world-size", std::to_string(world_size),
            "--rendezvous", "file:" + (dir_ / "rdv").string(),
            "--scenario",   scenario,
            "--dir",        dir_.string(),
            "--timeout-ms", "5000"};
  }
};

TEST_F(GlooSecret, RanksWithTheSameSecretRun) {
  GlooGroup group(dir_);
  auto a = args(3);
  a.insert(a.end(), {"--secret-file", secret("s", "correct horse battery staple")});
  group.spawn_all(3, a);
  for (const auto& e : group.wait_all(40s)) EXPECT_EQ(e.code, 0) << e.log;
}

TEST_F(GlooSecret, ARankWithTheWrongSecretIsRefusedWithItsAddress) {
  GlooGroup group(dir_);
  auto good = args(3), bad = args(3);
  good.insert(good.end(), {"--secret-file", secret("good", "correct horse battery staple")});
  bad.insert(bad.end(), {"--secret-file", secret("bad", "incorrect horse")});
  group.spawn(0, good);
  group.spawn(1, good);
  group.spawn(2, bad);
  const auto exits = group.wait_all(40s);
  for (const auto& e : exits) EXPECT_NE(e.code, 0) << e.log;
  for (int r : {0, 1}) {
    const std::string& log = exits[r].log;
    EXPECT_TRUE(log.find("peer rank 2 at [127.0.0.1]:") != std::string::npos &&
                log.find("failed to prove the job secret") != std::string::npos)
        << "rank " << r << ":\n"
        << log;
  }
}

TEST_F(GlooSecret, ARankWithoutTheSecretIsRefused) {
  GlooGroup group(dir_);
  auto good = args(2);
  good.insert(good.end(), {"--secret-file", secret("good", "correct horse battery staple")});
  group.spawn(0, good);
  group.spawn(1, args(2));
  const auto exits = group.wait_all(40s);
  EXPECT_NE(exits[0].log.find("peer rank 1 at"), std::string::npos) << exits[0].log;
  EXPECT_NE(exits[1].code, 0) << exits[1].log;
}

TEST_F(GlooSecret, ASecretFileOthersCanReadIsRefused) {
  GlooGroup group(dir_);
  auto a = args(1);
  a.insert(a.end(), {"--secret-file", secret("open", "correct horse battery staple", 0644)});
  group.spawn(0, a);
  const auto exits = group.wait_all(20s);
  EXPECT_EQ(exits[0].code, 2) << exits[0].log;
  EXPECT_NE(exits[0].log.find("has mode 0644"), std::string::npos) << exits[0].log;
  // A missing file is named with its option and what to do (it said only
  // "No such file or directory").
  GlooGroup missing(dir_);
  auto m = args(1);
  m.insert(m.end(), {"--secret-file", (dir_ / "nope").string()});
  missing.spawn(0, m);
  const auto gone = missing.wait_all(20s);
  EXPECT_EQ(gone[0].code, 2) << gone[0].log;
  EXPECT_NE(gone[0].log.find("secret file (secret_file, --secret-file) " + (dir_ / "nope").string() +
                             ": No such file or directory; give every rank the same file"),
            std::string::npos)
      << gone[0].log;
  // A file far too large to be a secret (here a sparse 1 GiB) is refused
  // before it is read.
  const auto big = secret("big", "x");
  std::filesystem::resize_file(big, std::uintmax_t{1} << 30);
  GlooGroup large(dir_);
  auto b = args(1);
  b.insert(b.end(), {"--secret-file", big});
  large.spawn(0, b);
  const auto too_big = large.wait_all(20s);
  EXPECT_EQ(too_big[0].code, 2) << too_big[0].log;
  EXPECT_NE(too_big[0].log.find(big + " is 1073741824 bytes, more than a secret's limit of 65536 bytes"),
            std::string::npos)
      << too_big[0].log;
}

// The local ports of every TCP socket the process `pid` holds.
std::set<int> tcp_ports_of(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(fd_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      char target[256] = {};
      const std::string link = fd_dir + "/" + e->d_name;
      if (::readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          std::string(target).rfind("socket:[", 0) == 0) {
        inodes.insert(std::string(target).substr(8, std::string(target).size() - 9));
      }
    }
    ::closedir(d);
  }
  std::set<int> ports;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream s(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
      s >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (inodes.count(inode)) ports.insert(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
    }
  }
  return ports;
}

// Connects to 127.0.0.1:port and sends `bytes` of garbage; false if nobody listens.
bool send_garbage(int port, std::size_t bytes, std::mt19937& rng) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  if (connected) {
    std::vector<unsigned char> junk(bytes);
    for (auto& b : junk) b = static_cast<unsigned char>(rng());
    (void)!::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
  }
  ::close(fd);
  return connected;
}

TEST_F(GlooSecret, GarbageSentToTheRanksPortsDoesNotDisturbTheJob) {
  GlooGroup group(dir_);
  auto a = args(3, "hold");
  a.insert(a.end(), {"--secret-file", secret("s", "correct horse battery staple")});
  std::vector<pid_t> pids;
  group.spawn_all(3, a);
  ASSERT_TRUE(group.wait_for_marks("connected", {0, 1, 2}, 40s));
  std::mt19937 rng(7);
  std::set<int> ports;
  for (pid_t pid : group.pids()) {
    const auto p = tcp_ports_of(pid);
    ports.insert(p.begin(), p.end());
  }
  EXPECT_GE(ports.size(), 3u) << "found none of the ranks' sockets";
  for (int port : ports) send_garbage(port, 4096, rng);
  group.go();
  for (const auto& e : group.wait_all(40s)) EXPECT_EQ(e.code, 0) << e.log;
}

}  // namespace
}  // namespace lockstep::testing
