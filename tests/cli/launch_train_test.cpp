// `lockstep launch -- train` end to end: real processes over Gloo on a tiny
// IDX data set. The same weights as the threads backend; a rank that throws,
// a rank killed with SIGKILL, and a killed launcher each stop the whole job,
// named, with no process left behind. Every run is under a wall-clock guard
// that kills the launcher (its ranks die with it) and fails the test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "lockstep/data/idx.h"
#include "peak_flops.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// 96 train and 24 test images of 4x4, 3 classes (learnable enough to move the weights).
fs::path make_data_dir(const std::string& name) {
  const fs::path dir = fs::path(LOCKSTEP_TEST_TMPDIR) / "launch" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const std::string& file, std::int64_t n, bool images) {
    std::vector<std::uint8_t> bytes;
    for (std::int64_t i = 0; i < n * (images ? 16 : 1); ++i)
      bytes.push_back(std::uint8_t(images ? (i * 37 + (i / 16) % 3 * 50) % 256 : i % 3));
    std::vector<std::int64_t> dims =
        images ? std::vector<std::int64_t>{n, 4, 4} : std::vector<std::int64_t>{n};
    lockstep::data::write_idx(dir / file, 0x08, dims, bytes, true);
  };
  write("train-images-idx3-ubyte.gz", 96, true);
  write("train-labels-idx1-ubyte.gz", 96, false);
  write("t10k-images-idx3-ubyte.gz", 24, true);
  write("t10k-labels-idx1-ubyte.gz", 24, false);
  return dir;
}

// One run of the lockstep CLI with stdout and stderr in files.
class CliRun {
 public:
  // Runs `program` (the lockstep CLI unless given, e.g. mpirun) with `args`.
  CliRun(const fs::path& dir, const std::vector<std::string>& args, const std::string& program = LOCKSTEP_CLI)
      : out_(dir / "out.txt"), err_(dir / "err.txt") {
    std::vector<std::string> argv_s = {program};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    // Its working directory is `dir`: a file written under a wrong (relative)
    // name lands there, where the tests see it, not wherever the test ran.
    posix_spawn_file_actions_addchdir_np(&fa, dir.c_str());
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
  }
  ~CliRun() {
    if (pid_ > 0 && status_ < 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  CliRun(const CliRun&) = delete;
  CliRun& operator=(const CliRun&) = delete;

  // The exit code (128 + signal if killed); on a hang, kills it and fails.
  int wait(std::chrono::seconds guard = std::chrono::seconds(50)) {
    const auto deadline = Clock::now() + guard;
    while (status_ < 0) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      } else if (Clock::now() > deadline) {
        ADD_FAILURE() << "still running after " << guard.count() << " s (hang); killed it\n" << err();
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        status_ = 999;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return status_;
  }
  // Waits until stderr holds `text`; false if the guard passed first.
  bool wait_for_err(const std::string& text, std::chrono::seconds guard = std::chrono::seconds(30)) {
    const auto deadline = Clock::now() + guard;
    while (err().find(text) == std::string::npos) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }
  pid_t pid() const { return pid_; }
  std::string out() const { return read_file(out_); }
  std::string err() const { return read_file(err_); }
  std::string last_err_line() const {
    std::string e = err();
    while (!e.empty() && e.back() == '\n') e.pop_back();
    return e.substr(e.rfind('\n') + 1);
  }
  // The ranks' pids from the launcher's first line ("... pids 11 12 13").
  std::vector<pid_t> rank_pids() const {
    const std::string e = err();
    const auto at = e.find("), pids ");
    std::vector<pid_t> pids;
    if (at == std::string::npos) return pids;
    std::istringstream in(e.substr(at + 8, e.find('\n', at) - at - 8));
    for (pid_t p; in >> p;) pids.push_back(p);
    return pids;
  }

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  int status_ = -1;
};

#ifndef LOCKSTEP_TEST_GLOO
#define LOCKSTEP_TEST_GLOO 0
#endif

class LaunchTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!LOCKSTEP_TEST_GLOO) GTEST_SKIP() << "built without the Gloo backend";
  }
};

fs::path run_dir(const std::string& name) {
  const fs::path dir = fs::path(LOCKSTEP_TEST_TMPDIR) / "launch" / ("run_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

bool gone(pid_t pid) {  // no such process, or a zombie about to be reaped by init
  if (kill(pid, 0) != 0) return true;
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || stat.substr(paren + 2, 1) == "Z";
}

bool all_gone(const std::vector<pid_t>& pids, std::chrono::seconds guard) {
  const auto deadline = Clock::now() + guard;
  for (;;) {
    if (std::all_of(pids.begin(), pids.end(), gone)) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::set<std::string> entries(const fs::path& dir) {  // the names in a directory
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// With a stated peak (--peak-gflops): otherwise rank 0 measures one at the
// end of every run, 0.15 s of every core. RanksAgreeOnOneBucket... checks
// both, and the measured peak over processes.
std::vector<std::string> train_args(const fs::path& data, const std::vector<std::string>& more) {
  std::vector<std::string> a = {"train",  "--data", data.string(), "--micro-batch", "4",
                                "--hidden", "8",    "--quiet",     "--peak-gflops", "50"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

std::vector<std::string> launch_args(int n, const std::vector<std::string>& train) {
  std::vector<std::string> a = {"launch", "--nproc", std::to_string(n), "--"};
  a.insert(a.end(), train.begin(), train.end());
  return a;
}

// The replica loop is deterministic given N and the all-reduce algorithm: the
// ring over Gloo adds the same numbers in the same order as the ring over
// threads, so the final weights are the same bits, and only rank 0 writes.
TEST_F(LaunchTrain, SameWeightsAsTheThreadsBackend) {
  const auto data = make_data_dir("same");
  for (int n : {3, 4}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    const auto dir = run_dir("same" + std::to_string(n));
    const std::vector<std::string> common = {"--steps", "10", "--algorithm", "ring", "--log-every", "5"};
    auto threads_args = train_args(data, common);
    threads_args.insert(threads_args.end(),
                        {"--replicas", std::to_string(n), "--save", (dir / "threads.safetensors").string(),
                         "--report", (dir / "threads.json").string()});
    const auto threads_dir = run_dir("same_threads" + std::to_string(n));
    CliRun threads(threads_dir, threads_args);
    ASSERT_EQ(threads.wait(), 0) << threads.err();

    auto launched_args = train_args(data, common);
    launched_args.insert(launched_args.end(), {"--save", (dir / "gloo.safetensors").string(), "--report",
                                               (dir / "gloo.json").string()});
    CliRun launched(dir, launch_args(n, launched_args));
    ASSERT_EQ(launched.wait(), 0) << launched.err();
    // --save and --report went exactly where they were told, and nowhere else
    // (stray files with garbage names once appeared in the working directory).
    EXPECT_EQ(entries(threads_dir), (std::set<std::string>{"err.txt", "out.txt"}));
    EXPECT_EQ(entries(dir), (std::set<std::string>{"err.txt", "gloo.json", "gloo.safetensors", "out.txt",
                                                   "threads.json", "threads.safetensors"}));

    const std::string a = read_file(dir / "threads.safetensors"), b = read_file(dir / "gloo.safetensors");
    ASSERT_GT(a.size(), 600u);
    EXPECT_TRUE(a == b) << "the final weights differ between threads and gloo";
    const auto ja = nlohmann::json::parse(read_file(dir / "threads.json"));
    const auto jb = nlohmann::json::parse(read_file(dir / "gloo.json"));
    EXPECT_NEAR(ja["final_loss"].get<double>(), jb["final_loss"].get<double>(), 1e-6);
    EXPECT_EQ(jb["replicas"], n);
    // Note [One bucket on shared cores]: processes and threads alike take one
    // bucket where the host's cores are all computing (on a 2-core host, here).
    const bool shared = jb["config"]["one_bucket_on_shared_cores"].get<bool>();
    EXPECT_EQ(ja["config"]["one_bucket_on_shared_cores"], shared);
    if (n >= sysconf(_SC_NPROCESSORS_ONLN)) {
      EXPECT_TRUE(shared);
    }
    EXPECT_EQ(jb["buckets"].size(), shared ? 1u : ja["buckets"].size());
    // Rank 0 alone printed the summary, relayed as is (so --json parses);
    // any other rank's line would carry its rank.
    const std::string out = launched.out();
    EXPECT_NE(out.find("\n  result"), std::string::npos) << out;
    EXPECT_EQ(out.find("[rank "), std::string::npos) << out;
    // Over processes each all-reduce also sends its fingerprint check: one
    // message per bucket more than the threads backend's ring.
    EXPECT_NE(out.find("counted message by message"), std::string::npos) << out;
    EXPECT_EQ(jb["bytes"]["gradient_messages_per_step_per_replica"].get<double>(),
              ja["bytes"]["gradient_messages_per_step_per_replica"].get<double>() + double(ja["buckets"].size()));
  }
  // Gloo's own all-reduce reports no traffic: booked, and said so.
  const auto dir = run_dir("same_native");
  CliRun native(dir, launch_args(2, train_args(data, {"--steps", "2", "--algorithm", "native"})));
  ASSERT_EQ(native.wait(), 0) << native.err();
  EXPECT_NE(native.out().find("booked as a ring would send them"), std::string::npos) << native.out();
}

#ifndef LOCKSTEP_MPIEXEC
#define LOCKSTEP_MPIEXEC ""
#endif

// mpirun's arguments to run `lockstep <train_args> --backend mpi` on n
// ranks, with the environment it needs here: OpenMPI refuses root
// (containers) unless told; shared memory between local ranks; OpenMPI keeps
// its allocations until exit (not ours to report).
std::vector<std::string> mpirun_args(int n, const std::vector<std::string>& train_args) {
  for (const char* v : {"OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"}) setenv(v, "1", 0);
  setenv("OMPI_MCA_btl", "self,vader", 0);
  setenv("ASAN_OPTIONS", "detect_leaks=0", 0);
  std::vector<std::string> a = {"-np", std::to_string(n), "--oversubscribe", LOCKSTEP_CLI};
  a.insert(a.end(), train_args.begin(), train_args.end());
  a.insert(a.end(), {"--backend", "mpi"});
  return a;
}

// --deterministic sums in one tree over atoms, whatever carries the bytes: the
// threads backend, our tree all-reduce over Gloo's TCP pairs, or over MPI
// point-to-point. The final weights are the same bits on all three.
TEST_F(LaunchTrain, DeterministicRunsAreTheSameBitsOnThreadsGlooAndMpi) {
  const auto data = make_data_dir("deterministic");
  const std::string mpiexec = LOCKSTEP_MPIEXEC;
  for (int n : {4, 8}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    const auto dir = run_dir("deterministic" + std::to_string(n));
    const std::vector<std::string> common = {"--deterministic", "--atom", "2", "--steps", "6"};
    auto args_saving = [&](const std::string& name) {
      auto a = train_args(data, common);
      a.insert(a.end(), {"--save", (dir / (name + ".safetensors")).string()});
      return a;
    };
    auto threads_args = args_saving("threads");
    threads_args.insert(threads_args.end(), {"--replicas", std::to_string(n)});
    CliRun threads(run_dir("deterministic_threads" + std::to_string(n)), threads_args);
    ASSERT_EQ(threads.wait(), 0) << threads.err();
    const std::string want = read_file(dir / "threads.safetensors");
    ASSERT_GT(want.size(), 600u);

    CliRun gloo(run_dir("deterministic_gloo" + std::to_string(n)), launch_args(n, args_saving("gloo")));
    ASSERT_EQ(gloo.wait(), 0) << gloo.err();
    EXPECT_TRUE(read_file(dir / "gloo.safetensors") == want) << "gloo's final weights differ from threads'";

    if (mpiexec.empty()) continue;  // built without the MPI backend
    CliRun mpi(run_dir("deterministic_mpi" + std::to_string(n)), mpirun_args(n, args_saving("mpi")), mpiexec);
    ASSERT_EQ(mpi.wait(), 0) << mpi.err();
    EXPECT_TRUE(read_file(dir / "mpi.safetensors") == want) << "mpi's final weights differ from threads'";
  }
}

// --zero 1 over processes: the ring's reduce-scatter and all-gather over
// Gloo's pairs (and MPI's point-to-point) add the same numbers in the same
// order as the ring all-reduce over threads, and each rank updates its own
// shard; the final weights are the threads backend's --zero 0 bits.
TEST_F(LaunchTrain, ZeroOneOverGlooAndMpiTrainsTheThreadsBackendsWeights) {
  const auto data = make_data_dir("zero");
  const std::string mpiexec = LOCKSTEP_MPIEXEC;
  const int n = 3;
  const auto dir = run_dir("zero");
  auto args_saving = [&](const std::string& name, const std::string& zero) {
    auto a = train_args(data, {"--steps", "8", "--algorithm", "ring", "--optimizer", "adamw", "--lr", "0.01",
                               "--zero", zero});
    a.insert(a.end(), {"--save", (dir / (name + ".safetensors")).string()});
    return a;
  };
  auto threads_args = args_saving("threads", "0");
  threads_args.insert(threads_args.end(), {"--replicas", std::to_string(n)});
  CliRun threads(run_dir("zero_threads"), threads_args);
  ASSERT_EQ(threads.wait(), 0) << threads.err();
  const std::string want = read_file(dir / "threads.safetensors");
  ASSERT_GT(want.size(), 600u);

  CliRun gloo(run_dir("zero_gloo"), launch_args(n, args_saving("gloo", "1")));
  ASSERT_EQ(gloo.wait(), 0) << gloo.err();
  EXPECT_TRUE(read_file(dir / "gloo.safetensors") == want) << "gloo's --zero 1 weights differ from threads' --zero 0";
  EXPECT_NE(gloo.out().find("optimizer state"), std::string::npos) << gloo.out();

  if (mpiexec.empty()) return;  // built without the MPI backend
  CliRun mpi(run_dir("zero_mpi"), mpirun_args(n, args_saving("mpi", "1")), mpiexec);
  ASSERT_EQ(mpi.wait(), 0) << mpi.err();
  EXPECT_TRUE(read_file(dir / "mpi.safetensors") == want) << "mpi's --zero 1 weights differ from threads' --zero 0";
}

// Note [MPI's start-up has no timeout]: a process of the job that never
// reaches MPI_Init (stopped, hung, still loading its data; here it sleeps
// instead of starting lockstep) held the other ranks in MPI_Init for ever.
// They now end after --rendezvous-timeout plus twice --timeout, saying why,
// and mpirun ends the job.
TEST_F(LaunchTrain, AnMpiRankThatNeverStartsMpiEndsTheJob) {
  const std::string mpiexec = LOCKSTEP_MPIEXEC;
  if (mpiexec.empty()) GTEST_SKIP() << "built without the MPI backend";
  const auto data = make_data_dir("mpi_never");
  auto args = mpirun_args(2, train_args(data, {"--steps", "2", "--rendezvous-timeout", "1", "--timeout", "1"}));
  const auto cli = std::find(args.begin(), args.end(), std::string(LOCKSTEP_CLI));
  ASSERT_NE(cli, args.end());
  args.insert(cli, {"sh", "-c", R"(if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec sleep 600; fi; exec "$0" "$@")"});
  CliRun r(run_dir("mpi_never"), args, mpiexec);
  EXPECT_NE(r.wait(std::chrono::seconds(120)), 0) << r.err();
  EXPECT_NE(r.err().find("rank 0: MPI's start-up did not finish within 3 s (--rendezvous-timeout plus twice "
                         "--timeout): a process of this job has not reached it"),
            std::string::npos)
      << r.err();
}

TEST_F(LaunchTrain, AThrowingRankStopsEveryRankAndIsNamed) {
  const auto data = make_data_dir("throw");
  CliRun r(run_dir("throw"), launch_args(3, train_args(data, {"--steps", "50", "--inject", "throw@2:1"})));
  EXPECT_NE(r.wait(), 0);
  const std::string err = r.err();
  EXPECT_NE(err.find("[rank 1] lockstep: error: rank 1: injected failure at step 2"), std::string::npos)
      << err;
  EXPECT_NE(r.last_err_line().find("rank 1 failed first: exit code 1"), std::string::npos) << err;
  const auto pids = r.rank_pids();
  EXPECT_EQ(pids.size(), 3u) << err;
  EXPECT_TRUE(all_gone(pids, std::chrono::seconds(10)));
}

// Training under way, one rank is SIGKILLed: the launcher stops the others
// and names it; nothing is left behind.
TEST_F(LaunchTrain, ASigkilledRankStopsEveryRankAndIsNamed) {
  const auto data = make_data_dir("kill");
  auto args = train_args(data, {"--steps", "1000000", "--timeout", "2", "--log-every", "5"});
  args.erase(std::find(args.begin(), args.end(), "--quiet"));  // the progress line says training runs
  CliRun r(run_dir("kill"), launch_args(3, args));
  ASSERT_TRUE(r.wait_for_err("[rank 0] epoch")) << r.err();
  const auto pids = r.rank_pids();
  ASSERT_EQ(pids.size(), 3u) << r.err();
  kill(pids[2], SIGKILL);
  // Within the collective timeout + 5 s (the launcher does not even wait for the timeout).
  EXPECT_EQ(r.wait(std::chrono::seconds(2 + 5)), 128 + SIGKILL);
  EXPECT_NE(r.last_err_line().find("rank 2 failed first: killed by signal 9 (SIGKILL)"), std::string::npos)
      << r.err();
  EXPECT_TRUE(all_gone(pids, std::chrono::seconds(10)));
}

// A rank frozen by SIGSTOP: the others time out, and the first of them
// "fails first"; the launcher says which rank was stopped (it named rank 0
// alone), and no process is left behind, the stopped one included.
TEST_F(LaunchTrain, AStoppedRankIsNamedWhenTheOthersTimeOut) {
  const auto data = make_data_dir("stop");
  auto args = train_args(data, {"--steps", "1000000", "--timeout", "2", "--log-every", "5"});
  args.erase(std::find(args.begin(), args.end(), "--quiet"));
  CliRun r(run_dir("stop"), launch_args(3, args));
  ASSERT_TRUE(r.wait_for_err("[rank 0] epoch")) << r.err();
  const auto pids = r.rank_pids();
  ASSERT_EQ(pids.size(), 3u) << r.err();
  kill(pids[1], SIGSTOP);
  EXPECT_EQ(r.wait(std::chrono::seconds(2 + 10)), 1) << r.err();
  EXPECT_NE(r.last_err_line().find("while rank 1 was stopped by signal 19 (SIGSTOP) and could not answer"),
            std::string::npos)
      << r.err();
  EXPECT_TRUE(all_gone(pids, std::chrono::seconds(10)));
}

// The launcher itself is SIGKILLed: its ranks die with it (PR_SET_PDEATHSIG).
// It cannot remove its rendezvous directory; the next launch on the host
// does, and leaves a live launcher's alone: one whose pid runs, and one
// whose pid does not but which holds its directory's lock (a launcher in
// another pid namespace).
TEST_F(LaunchTrain, NoOrphansWhenTheLauncherIsKilled) {
  const auto data = make_data_dir("orphans");
  // TMPDIR for the launchers, restored however the test ends.
  struct TmpDir {
    std::optional<std::string> saved;
    explicit TmpDir(const fs::path& dir) {
      if (const char* was = std::getenv("TMPDIR")) saved = was;
      setenv("TMPDIR", dir.c_str(), 1);
    }
    ~TmpDir() {
      if (saved) setenv("TMPDIR", saved->c_str(), 1);
      else unsetenv("TMPDIR");
    }
  } const tmpdir(run_dir("orphans-tmpdir"));
  CliRun r(run_dir("orphans"), launch_args(2, train_args(data, {"--steps", "1000000"})));
  ASSERT_TRUE(r.wait_for_err("), pids ")) << r.err();
  const auto pids = r.rank_pids();
  ASSERT_EQ(pids.size(), 2u) << r.err();
  kill(r.pid(), SIGKILL);
  EXPECT_EQ(r.wait(), 128 + SIGKILL);
  EXPECT_TRUE(all_gone(pids, std::chrono::seconds(20))) << "ranks outlived the launcher";
  const std::string err = r.err();
  const auto at = err.find("rendezvous file:");
  ASSERT_NE(at, std::string::npos) << err;
  const std::string dir = err.substr(at + 16, err.find(')', at) - at - 16);
  ASSERT_NE(dir.find("lockstep-launch-"), std::string::npos) << dir;
  EXPECT_TRUE(fs::exists(dir));
  // A directory named for a launcher that still runs (this test's pid).
  const auto suffix = dir.rfind('-'), pid_at = dir.rfind('-', suffix - 1) + 1;  // ...-<pid>-XXXXXX
  const std::string live = dir.substr(0, pid_at) + std::to_string(::getpid()) + dir.substr(suffix);
  fs::create_directories(live);
  const pid_t gone = fork();  // a pid that no longer runs
  if (gone == 0) _exit(0);
  ASSERT_GT(gone, 0);
  ::waitpid(gone, nullptr, 0);
  const std::string elsewhere = dir.substr(0, pid_at) + std::to_string(gone) + dir.substr(suffix) + "x";
  fs::create_directories(elsewhere);
  const int held = ::open(elsewhere.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  CliRun next(run_dir("orphans-next"), launch_args(2, train_args(data, {"--steps", "1"})));
  EXPECT_EQ(next.wait(), 0) << next.err();
  EXPECT_FALSE(fs::exists(dir)) << "the killed launcher's rendezvous directory is still there";
  EXPECT_TRUE(fs::exists(live)) << "a live launcher's directory was removed: " << live;
  EXPECT_TRUE(fs::exists(elsewhere)) << "a locked directory was removed: " << elsewhere;
  ::close(held);
  fs::remove_all(dir);
  fs::remove_all(live);
  fs::remove_all(elsewhere);
}

// --trace and --timeline-svg over processes draw every rank, not rank 0
// alone, on one clock: a ring all-reduce cannot end on any rank before every
// rank has started it, so each step's bucket spans overlap across the ranks
// (up to the clock alignment's error). On one host the processes' zeros are
// only milliseconds apart, so this holds the rows and their order, not the
// alignment; GatherTimeline.MovesEveryRankOntoRankZerosClock holds that, with
// zeros seconds apart.
TEST_F(LaunchTrain, TheTraceAndTheTimelineShowEveryRankOnOneClock) {
  const auto data = make_data_dir("trace");
  const auto dir = run_dir("trace");
  CliRun run(dir, launch_args(3, train_args(data, {"--steps", "6", "--algorithm", "ring", "--trace",
                                                   (dir / "t.json").string(), "--timeline-svg",
                                                   (dir / "t.svg").string()})));
  ASSERT_EQ(run.wait(), 0) << run.err();
  const auto trace = nlohmann::json::parse(read_file(dir / "t.json"));
  std::set<int> tids;
  std::map<std::pair<std::int64_t, std::string>, std::vector<std::pair<double, double>>> allreduces;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    tids.insert(e["tid"].get<int>());
    const std::string name = e["name"];
    if (name.rfind("allreduce bucket", 0) != 0) continue;
    const double ts = e["ts"], dur = e["dur"];
    allreduces[{e["args"]["step"].get<std::int64_t>(), name}].push_back({ts, ts + dur});
  }
  EXPECT_EQ(tids, (std::set<int>{0, 1, 2, 3, 4, 5})) << "compute and comm rows of replicas 0, 1 and 2";
  ASSERT_EQ(allreduces.size(), 6u);  // one bucket (the model is tiny), six steps
  for (const auto& [key, spans] : allreduces) {
    SCOPED_TRACE("step " + std::to_string(key.first) + ", " + key.second);
    ASSERT_EQ(spans.size(), 3u);
    double last_start = 0, first_end = 1e300;
    for (const auto& [start, end] : spans) {
      last_start = std::max(last_start, start);
      first_end = std::min(first_end, end);
    }
    EXPECT_LE(last_start, first_end + 5000.0) << "an all-reduce ended before another rank started it";
  }
  const std::string svg = read_file(dir / "t.svg");
  for (const char* row : {">replica 0<", ">replica 1<", ">replica 2<"}) EXPECT_NE(svg.find(row), std::string::npos) << row;
}

// Only rank 0 writes the trace, so its command line decides whether the
// ranks send their events: a --trace given to rank 0's host only (or to the
// others only) is no mismatch, and nothing is lost. Before, the ranks
// disagreed on whether to gather, and rank 0 timed out after training
// without writing --save.
// Two Gloo ranks started by hand (a file rendezvous in `dir`), 4 steps each;
// `more(r, args)` adds rank r's own flags.
std::vector<std::unique_ptr<CliRun>> start_two_ranks(const fs::path& data, const fs::path& dir,
                                                     const std::function<void(int, std::vector<std::string>&)>& more) {
  fs::create_directories(dir / "rv");
  std::vector<std::unique_ptr<CliRun>> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> extra = {"--steps",      "4", "--backend", "gloo", "--rank", std::to_string(r),
                                      "--world-size", "2", "--rendezvous", "file:" + (dir / "rv").string(),
                                      "--timeout",    "20"};
    more(r, extra);
    const auto rank_dir = dir / ("rank" + std::to_string(r));
    fs::create_directories(rank_dir);
    ranks.push_back(std::make_unique<CliRun>(rank_dir, train_args(data, extra)));
  }
  return ranks;
}

TEST_F(LaunchTrain, ATraceAskedForOnSomeRanksOnlyIsNoMismatch) {
  const auto data = make_data_dir("trace_some");
  for (const int traced : {0, 1}) {
    SCOPED_TRACE("--trace on rank " + std::to_string(traced));
    const auto dir = run_dir("trace_some" + std::to_string(traced));
    auto ranks = start_two_ranks(data, dir, [&](int r, std::vector<std::string>& extra) {
      if (r == traced) extra.insert(extra.end(), {"--trace", (dir / "t.json").string()});
      if (r == 0) extra.insert(extra.end(), {"--save", (dir / "w.safetensors").string()});
    });
    for (auto& rank : ranks) EXPECT_EQ(rank->wait(), 0) << rank->err();
    EXPECT_TRUE(fs::exists(dir / "w.safetensors"));
    if (traced == 0) {
      const auto trace = nlohmann::json::parse(read_file(dir / "t.json"));
      std::set<int> tids;
      for (const auto& e : trace["traceEvents"])
        if (e["ph"] == "X") tids.insert(e["tid"].get<int>());
      EXPECT_EQ(tids, (std::set<int>{0, 1, 2, 3})) << "both replicas' rows";
      EXPECT_EQ(ranks[1]->err().find("warning"), std::string::npos) << ranks[1]->err();
    } else {
      EXPECT_FALSE(fs::exists(dir / "t.json")) << "only rank 0 writes files";
      // ... and rank 1, given the flag alone, says so instead of ignoring it without a word.
      EXPECT_NE(ranks[1]->err().find("warning: rank 1: --trace is written by rank 0 alone, which was not given it"),
                std::string::npos)
          << ranks[1]->err();
    }
  }
}

// --auto-resume across hosts (Note [Restarts]): every rank looks for the
// --checkpoint file itself, so it must be one file every host sees. Here each
// rank runs in a directory of its own, and c.st is rank 0's alone: rank 1,
// which did not find it, says so, naming the file and rank 0's step, and is
// not restarted (exit 2). Before, the handshake refused both with "--resume
// ... differs; start every replica with the same flags", which they had.
TEST_F(LaunchTrain, AnAutoResumeCheckpointOneRankDoesNotSeeIsNamed) {
  const auto data = make_data_dir("auto_resume_unseen");
  const auto dir = run_dir("auto_resume_unseen");
  const auto job = [](std::vector<std::string>& extra) {
    extra.insert(extra.end(), {"--checkpoint", "c.st", "--auto-resume", "--checkpoint-every", "2"});
  };
  {  // the first run: rank 0 writes rank0/c.st at step 2, then rank 1 fails
    auto ranks = start_two_ranks(data, dir / "first", [&](int, std::vector<std::string>& extra) {
      job(extra);
      extra.insert(extra.end(), {"--inject", "throw@3:1"});
    });
    for (auto& rank : ranks) EXPECT_NE(rank->wait(), 0) << rank->err();
  }
  fs::create_directories(dir / "again" / "rank0");
  fs::copy_file(dir / "first" / "rank0" / "c.st", dir / "again" / "rank0" / "c.st");
  auto ranks = start_two_ranks(data, dir / "again", [&](int, std::vector<std::string>& extra) { job(extra); });
  EXPECT_EQ(ranks[1]->wait(), 2) << ranks[1]->err();
  EXPECT_EQ(ranks[0]->wait(), 3) << ranks[0]->err();
  const std::string want =
      "rank 1: --auto-resume: this rank did not find c.st, and rank 0 goes on from its copy after step 2; every rank "
      "reads the checkpoint, so across hosts it must be one file on a filesystem every host sees.";
  EXPECT_NE(ranks[1]->err().find(want), std::string::npos) << ranks[1]->err();
  EXPECT_NE(ranks[0]->err().find(want), std::string::npos) << "rank 0 learns why: " << ranks[0]->err();
}

// Two Gloo ranks training the 1.4 MB MLP 784-600-600-10 (two buckets by
// default) for 2 steps, rank r with LOCAL_WORLD_SIZE local[r]; `adjust` may
// change rank r's arguments and the program that starts it (taskset, sh).
// Rank 0's report.
nlohmann::json two_rank_report(
    const fs::path& data, const fs::path& dir, const std::array<const char*, 2>& local,
    const std::function<void(int, std::vector<std::string>&, std::string&)>& adjust) {
  const auto report = dir / "r.json";
  fs::create_directories(dir / "rv");
  std::vector<std::unique_ptr<CliRun>> all;
  for (int r = 0; r < 2; ++r) {
    auto args = train_args(data, {"--steps", "2", "--backend", "gloo", "--rank", std::to_string(r), "--world-size",
                                  "2", "--rendezvous", "file:" + (dir / "rv").string(), "--timeout", "20"});
    *std::next(std::find(args.begin(), args.end(), "--hidden")) = "600,600";
    if (r == 0) args.insert(args.end(), {"--report", report.string()});
    std::string program = LOCKSTEP_CLI;
    adjust(r, args, program);
    ::setenv("LOCAL_WORLD_SIZE", local[r], 1);  // inherited by the rank started now
    fs::create_directories(dir / ("rank" + std::to_string(r)));
    all.push_back(std::make_unique<CliRun>(dir / ("rank" + std::to_string(r)), args, program));
  }
  ::unsetenv("LOCAL_WORLD_SIZE");
  bool ok = true;
  for (auto& rank : all) {
    const int code = rank->wait();
    EXPECT_EQ(code, 0) << rank->err();
    ok = ok && code == 0;
  }
  return ok ? nlohmann::json::parse(read_file(report)) : nlohmann::json();
}

// train_args() without its --peak-gflops: the run measures the peak.
void drop_stated_peak(std::vector<std::string>& args) {
  const auto at = std::find(args.begin(), args.end(), "--peak-gflops");
  ASSERT_NE(at, args.end());
  args.erase(at, at + 2);
}

// Note [One bucket on shared cores] over processes: the ranks agree. Two
// ranks counted one per host (LOCAL_WORLD_SIZE=1, as on two hosts) keep the
// buckets on a host of 2 or more cores; one of them counted two to a host
// (2 on its host of 2 cores, here) makes both take one bucket; and a rank
// given --overlap on keeps the buckets for both, so neither is refused. Two
// ranks one per host but each bound to one core (taskset, as mpirun binds)
// take one bucket too: the process's cores are shared. Also the peak MFU is
// against: one host's (measured, or --peak-gflops) times the hosts that rank
// 0's LOCAL_WORLD_SIZE counts.
TEST_F(LaunchTrain, RanksAgreeOnOneBucketWhereSomeHostsCoresAreShared) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 2 || cores > 2) GTEST_SKIP() << "written for a host of 2 cores, as CI's";
  const auto data = make_data_dir("one_bucket");
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.size() != 2 || lockstep::cli::host_cores().cores != 2) GTEST_SKIP() << "this process may not use both cores";
  if (!fs::exists("/usr/bin/taskset")) GTEST_SKIP() << "no taskset (util-linux) to bind a rank with";
  struct Case {
    const char* name;
    std::array<const char*, 2> local;  // LOCAL_WORLD_SIZE of rank 0 and rank 1
    const char* rank0_flag;            // or nullptr
    bool bound;                        // rank r started under taskset, on the r-th CPU
    bool one_bucket;
  };
  for (const Case& k : {Case{"one per host", {"1", "1"}, nullptr, false, false},
                        Case{"one host full", {"1", "2"}, nullptr, false, true},
                        Case{"overlap on at rank 0", {"2", "2"}, "--overlap", false, false},
                        Case{"one per host, each bound to a core", {"1", "1"}, nullptr, true, true}}) {
    SCOPED_TRACE(k.name);
    const auto dir = run_dir(std::string("one_bucket_") + k.local[0] + k.local[1] + (k.rank0_flag ? "on" : "") +
                             (k.bound ? "bound" : ""));
    const auto j = two_rank_report(data, dir, k.local, [&](int r, std::vector<std::string>& args, std::string& program) {
      if (k.one_bucket) drop_stated_peak(args);  // these cases measure the peak
      if (r == 0 && k.rank0_flag) args.insert(args.end(), {k.rank0_flag, "on"});
      if (k.bound) {
        args.insert(args.begin(), {"-c", std::to_string(cpus[r]), program});
        program = "/usr/bin/taskset";
      }
    });
    ASSERT_FALSE(j.is_null());
    EXPECT_EQ(j["config"]["one_bucket_on_shared_cores"], k.one_bucket);
    EXPECT_EQ(j["buckets"].size(), k.one_bucket ? 1u : 2u);
    const double hosts = 2.0 / std::stod(k.local[0]), peak = j["peak_flops"].get<double>();
    EXPECT_EQ(j["peak_flops_measured"], k.one_bucket);
    if (k.one_bucket) {
      EXPECT_GT(peak, 1e9 * hosts);
    } else {
      EXPECT_EQ(peak, 50e9 * hosts);
    }
    EXPECT_NEAR(j["mfu"].get<double>(),
                j["samples_per_s"].get<double>() * j["flops_per_sample"].get<double>() / peak,
                1e-12 + 1e-9 * j["mfu"].get<double>());
  }
}

// A cgroup of this test's own under `controller` with one limit set: v1's
// file and value in /sys/fs/cgroup/<controller>/, else v2's in
// /sys/fs/cgroup/; named after this process, so that runs side by side do
// not share it, and removed when it goes (its processes have exited by
// then). path() is empty where this host will not make one (not root, no
// writable cgroup file system).
class TestCgroup {
 public:
  TestCgroup(const std::string& controller, const std::pair<std::string, std::string>& v1_limit,
             const std::pair<std::string, std::string>& v2_limit) {
    std::error_code ec;
    const bool v1 = fs::is_directory("/sys/fs/cgroup/" + controller, ec);
    const fs::path dir = (v1 ? "/sys/fs/cgroup/" + controller : std::string("/sys/fs/cgroup")) + "/lockstep_test_" +
                         controller + "_" + std::to_string(getpid());
    const auto& [file, value] = v1 ? v1_limit : v2_limit;
    if (!fs::create_directory(dir, ec) || ec) return;
    dir_ = dir;
    std::ofstream(dir / file) << value;
    std::ifstream check(dir / file);
    std::string set;
    if (!std::getline(check, set) || set != value) remove();
  }
  ~TestCgroup() { remove(); }
  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;
  const fs::path& path() const { return dir_; }

 private:
  void remove() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove(dir_, ec);
    dir_.clear();
  }
  fs::path dir_;
};

// Starts `args` (then `program`) from a shell that first moves itself into `cgroup`.
void start_in_cgroup(const fs::path& cgroup, std::vector<std::string>& args, std::string& program) {
  args.insert(args.begin(), {"-c", "echo $$ > " + (cgroup / "cgroup.procs").string() + " && exec \"$0\" \"$@\"", program});
  program = "/bin/sh";
}

// The cores of a process's cgroup count, not the host's: two ranks one per
// host (LOCAL_WORLD_SIZE=1), each in a cgroup with a quota of one CPU, have
// no core to spare on a 2-core host, and take one bucket (cli/cgroup.h).
TEST_F(LaunchTrain, RanksHeldToOneCpuByTheirCgroupTakeOneBucket) {
  if (sysconf(_SC_NPROCESSORS_ONLN) != 2 || lockstep::cli::host_cores().cores != 2) GTEST_SKIP() << "written for a host of 2 cores, as CI's";
  const TestCgroup one_cpu("cpu", {"cpu.cfs_quota_us", "100000"}, {"cpu.max", "100000 100000"});
  const fs::path& cgroup = one_cpu.path();
  if (cgroup.empty()) GTEST_SKIP() << "cannot make a cgroup with a CPU quota here (needs root)";
  const auto j = two_rank_report(make_data_dir("one_cpu_cgroup"), run_dir("one_cpu_cgroup"), {"1", "1"},
                                 [&](int, std::vector<std::string>& args, std::string& program) {
                                   start_in_cgroup(cgroup, args, program);
                                 });
  ASSERT_FALSE(j.is_null());
  EXPECT_TRUE(j["config"]["one_bucket_on_shared_cores"].get<bool>());
  EXPECT_EQ(j["buckets"].size(), 1u);
}

// And its memory: a run that needs more than its cgroup's memory limit
// leaves (2.2 GB of replicas' state, in 256 MiB) is refused at start, saying
// how much it needs and has, instead of being killed by the OOM killer with
// no word when it allocates (exit 137 before cgroup limits were read).
TEST_F(LaunchTrain, ARunOverItsCgroupsMemoryLimitIsRefusedNotKilled) {
  // 256 MiB: a whole number of pages (v1 rounds the limit down to one), and
  // room for the ~70 MB an AddressSanitizer build takes to start.
  const TestCgroup limited("memory", {"memory.limit_in_bytes", "268435456"}, {"memory.max", "268435456"});
  const fs::path& cgroup = limited.path();
  if (cgroup.empty()) GTEST_SKIP() << "cannot make a cgroup with a memory limit here (needs root)";
  const fs::path dir = run_dir("memory_cgroup");
  std::vector<std::string> args = {"train",   "--data",   make_data_dir("memory_cgroup").string(), "--replicas", "8",
                                   "--steps", "1",        "--micro-batch", "1", "--hidden", "4096,4096"};
  std::string program = LOCKSTEP_CLI;
  start_in_cgroup(cgroup, args, program);
  CliRun run(dir, args, program);
  EXPECT_EQ(run.wait(), 2) << run.err();
  EXPECT_NE(run.err().find("GB for 8 replicas' weights, gradients and optimizer state"), std::string::npos)
      << run.err();
  EXPECT_NE(run.err().find(" MB free; lower --replicas"), std::string::npos) << run.err();
}

// Ranks started by hand, each with its own command line: one with
// --normalize trains on other inputs, and one with another --log-every would
// make its progress collectives at other steps. Both are refused at start,
// naming the flag, instead of training apart (--normalize: a wrong loss and
// exit 0) or failing later with a collective mismatch that names neither.
TEST_F(LaunchTrain, RanksWithOtherInputsOrProgressIntervalsRefuseToStart) {
  const auto data = make_data_dir("handshake_flags");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--normalize"}, "training inputs (the image files, --normalize)"},
      {{"--log-every", "5"}, "--log-every"},
  };
  for (const auto& [flag_, field] : cases) {
    const auto& flag = flag_;  // a lambda captures it (clang 14 cannot capture a binding)
    SCOPED_TRACE(flag[0]);
    auto ranks = start_two_ranks(data, run_dir("handshake_flags" + flag[0]), [&](int r, std::vector<std::string>& extra) {
      if (r == 0) extra.insert(extra.end(), flag.begin(), flag.end());
    });
    for (auto& rank : ranks) {
      EXPECT_NE(rank->wait(), 0) << rank->err();
      EXPECT_NE(rank->err().find("start-up handshake refused: " + field), std::string::npos) << rank->err();
    }
  }
}

// The world size comes from the launcher; --replicas must agree with it.
// And the launcher's --rendezvous-timeout reaches the ranks as
// LOCKSTEP_RENDEZVOUS_TIMEOUT: a rank of a world of 2 that the other never
// joins gives up after it, naming the missing rank. (This used `launch
// --nproc 2 -- train --world-size 3`; launch now refuses a --world-size in
// the command at once, CommandsThatDoNotJoinTheGroupAreRefused, so the
// missing rank is made here by starting one rank of two by hand, with the
// variable launch sets.)
TEST_F(LaunchTrain, ReplicasAndRendezvousTimeoutComeFromTheLauncher) {
  const auto data = make_data_dir("flags");
  CliRun mismatch(run_dir("mismatch"), launch_args(2, train_args(data, {"--steps", "3", "--replicas", "3"})));
  EXPECT_NE(mismatch.wait(), 0);
  EXPECT_NE(mismatch.err().find("--replicas 3 does not match the world size 2"), std::string::npos)
      << mismatch.err();
  const auto dir = run_dir("missing");
  ::setenv("LOCKSTEP_RENDEZVOUS_TIMEOUT", "1", 1);
  CliRun missing(dir, train_args(data, {"--steps", "3", "--backend", "gloo", "--world-size", "2", "--rank", "0",
                                        "--rendezvous", "file:" + (dir / "rdv").string()}));
  ::unsetenv("LOCKSTEP_RENDEZVOUS_TIMEOUT");
  EXPECT_NE(missing.wait(std::chrono::seconds(30)), 0) << "the 60 s default, not the 1 s given";
  EXPECT_NE(missing.err().find("rank 1 of 2 has not joined"), std::string::npos) << missing.err();
  // Rank 0's standard output is passed on as is, so its report parses there;
  // its standard error is relayed behind "[rank 0] ", so an output there is
  // refused before training.
  CliRun to_stdout(run_dir("report-stdout"),
                   launch_args(2, train_args(data, {"--steps", "2", "--report", "/dev/stdout"})));
  EXPECT_EQ(to_stdout.wait(), 0) << to_stdout.err();
  EXPECT_TRUE(nlohmann::json::accept(to_stdout.out())) << to_stdout.out();
  CliRun to_stderr(run_dir("report-stderr"),
                   launch_args(2, train_args(data, {"--steps", "2", "--report", "/dev/stderr"})));
  EXPECT_EQ(to_stderr.wait(), 2) << to_stderr.err();
  EXPECT_NE(to_stderr.err().find("--report /dev/stderr: lockstep launch puts \"[rank N] \" before each line"),
            std::string::npos)
      << to_stderr.err();
  EXPECT_EQ(to_stderr.err().find("\"replicas\""), std::string::npos) << to_stderr.err();
  // Two ranks given different job ids never meet: each times out naming its
  // own job id and the flag that sets it.
  const auto two = run_dir("two-jobs");
  std::vector<std::unique_ptr<CliRun>> ranks;
  for (const std::string rank : {"0", "1"}) {
    ranks.push_back(std::make_unique<CliRun>(
        run_dir("two-jobs-" + rank), train_args(data, {"--steps", "3", "--backend", "gloo", "--world-size", "2", "--rank", rank,
                               "--rendezvous", "file:" + (two / "rdv").string(), "--job-id", "job" + rank,
                               "--rendezvous-timeout", "1"})));
  }
  for (const std::string rank : {"0", "1"}) {
    auto& r = *ranks[std::stoi(rank)];
    EXPECT_NE(r.wait(std::chrono::seconds(30)), 0);
    EXPECT_NE(r.err().find("has not joined (every rank needs this rendezvous and job id 'job" + rank + "' (--job-id)"),
              std::string::npos)
        << r.err();
  }
  // Through launch itself: 1 ms is too short for the join and the connect
  // (one deadline), and the ranks say so with the launcher's value.
  auto fast = launch_args(2, train_args(data, {"--steps", "3"}));
  fast.insert(fast.begin() + 3, {"--rendezvous-timeout", "0.001"});
  CliRun quick(run_dir("quick"), fast);
  EXPECT_NE(quick.wait(std::chrono::seconds(30)), 0);
  EXPECT_NE(quick.err().find("timed out"), std::string::npos) << quick.err();
  EXPECT_EQ(quick.err().find("60000 ms"), std::string::npos) << quick.err();
}

// SIGINT to `lockstep train` stops it at the replicas' next stop vote with its
// outputs written and exit status 130; alone, and under launch, which
// forwards it to every rank and calls that an interruption, not a failure.
// SIGUSR1 does the same (exit status 138): mpirun forwards it and lets the
// ranks end, where it kills them a moment after forwarding SIGINT.
// A second SIGINT ends the process at once, writing nothing.
TEST_F(LaunchTrain, AnInterruptStopsTrainingWithTheOutputsWritten) {
  const auto data = make_data_dir("interrupt");
  enum class Under { Nothing, Launch, Mpirun };
  struct Case {
    Under under;
    int sig;
    const char* name;
  };
  const std::string mpiexec = LOCKSTEP_MPIEXEC;
  for (const Case k : {Case{Under::Nothing, SIGINT, "interrupt"}, Case{Under::Launch, SIGINT, "interrupt-launch"},
                       Case{Under::Nothing, SIGUSR1, "usr1"}, Case{Under::Launch, SIGUSR1, "usr1-launch"},
                       Case{Under::Mpirun, SIGUSR1, "usr1-mpirun"}}) {
    SCOPED_TRACE(k.name);
    if (k.under == Under::Mpirun && mpiexec.empty()) continue;  // built without the MPI backend
    const auto dir = run_dir(k.name);
    auto args = train_args(data, {"--steps", "1000000", "--log-every", "5", "--save", (dir / "w.st").string(),
                                  "--report", (dir / "r.json").string()});
    args.erase(std::find(args.begin(), args.end(), "--quiet"));  // for the progress lines
    std::string program = LOCKSTEP_CLI;
    if (k.under == Under::Launch) args = launch_args(2, args);
    if (k.under == Under::Mpirun) {
      args = mpirun_args(2, args);
      program = mpiexec;
    }
    CliRun run(dir, args, program);
    ASSERT_TRUE(run.wait_for_err("step 5/1000000")) << run.err();
    kill(run.pid(), k.sig);
    EXPECT_EQ(run.wait(), 128 + k.sig) << run.err();
    EXPECT_NE(run.err().find("interrupted; stopping at the replicas' next stop vote"), std::string::npos) << run.err();
    if (k.under == Under::Launch) {
      const std::string said = std::string("interrupted by signal ") + std::to_string(k.sig) + " (SIG" +
                               (k.sig == SIGINT ? "INT" : "USR1") + ")";
      EXPECT_NE(run.last_err_line().find(said), std::string::npos) << run.err();
    }
    ASSERT_TRUE(fs::exists(dir / "w.st"));
    const auto report = nlohmann::json::parse(read_file(dir / "r.json"));
    EXPECT_TRUE(report["stopped_early"].get<bool>());
    EXPECT_EQ(report["steps_planned"].get<int>(), 1000000);
    EXPECT_LT(report["steps"].get<int>(), 1000000);
    EXPECT_NE(run.out().find("stopped      early, after step"), std::string::npos) << run.out();
    // The summary names every signal that stops it, SIGUSR1 among them.
    EXPECT_NE(run.out().find("(SIGINT, SIGTERM, SIGHUP or SIGUSR1 to lockstep train"), std::string::npos) << run.out();
  }
  // The same signal twice within a second (GNU timeout sends it to its child
  // and again to its process group) is one request; a second one a second
  // or more later ends the run at once. A very slow modelled link (~5 s a
  // step for this model of ~160 parameters: 2 replicas x 1) keeps the first
  // stop vote, after the first step, well past the checks below.
  const auto dir = run_dir("interrupt-twice");
  CliRun run(dir, {"train", "--data", data.string(), "--replicas", "2", "--micro-batch", "1", "--hidden", "8",
                   "--steps", "1000000", "--log-every", "1000000", "--link-bandwidth", "1kbit", "--report",
                   (dir / "r.json").string()});
  ASSERT_TRUE(run.wait_for_err("lockstep train:")) << run.err();  // printed just before training starts
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(run.pid(), SIGINT);
  kill(run.pid(), SIGINT);  // the same request, delivered again
  ASSERT_TRUE(run.wait_for_err("interrupted; stopping")) << run.err();  // taken as a request
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  ASSERT_EQ(::waitpid(run.pid(), nullptr, WNOHANG), 0) << "a signal delivered twice ended the run";
  kill(run.pid(), SIGINT);
  EXPECT_EQ(run.wait(), 128 + SIGINT) << run.err();
  EXPECT_FALSE(fs::exists(dir / "r.json")) << "the second interrupt ends the run at once";
}

// Ctrl-C, then --resume: a run interrupted and resumed from its checkpoint
// saves the same bytes as the unbroken run. Interrupted in one process (over
// a slow modelled link, so that it is still running: the link changes when
// bytes arrive, not the ring's sums) and under launch over Gloo (the ring
// over processes adds as the ring over threads), resumed in one process.
// Under --zero 1 over Gloo, the checkpoint gathers every rank's shard of the
// optimizer state, and the run resumed in one process saves --zero 0's bytes.
// A checkpoint also serves --init (its weights), and --resume refuses other
// flags, a finished run's checkpoint and a plain weights file.
TEST_F(LaunchTrain, AnInterruptedRunResumedFromItsCheckpointEndsAsTheUnbrokenRun) {
  const auto data = make_data_dir("resume");
  const auto common = [&](const std::vector<std::string>& more) {
    std::vector<std::string> a = {"--steps", "3000", "--replicas", "2", "--algorithm", "ring", "--log-every", "5"};
    a.insert(a.end(), more.begin(), more.end());
    return train_args(data, a);
  };
  const auto whole_dir = run_dir("resume-whole");
  CliRun whole(whole_dir, common({"--save", (whole_dir / "w.st").string(), "--report",
                                  (whole_dir / "r.json").string()}));
  ASSERT_EQ(whole.wait(), 0) << whole.err();
  const std::string want = read_file(whole_dir / "w.st");
  ASSERT_FALSE(want.empty());

  std::string finished;  // a checkpoint of the finished run
  struct Case {
    bool launched;
    std::vector<std::string> flags;
  };
  for (const Case& k : {Case{false, {}}, Case{true, {}}, Case{true, {"--zero", "1"}}}) {
    const bool launched = k.launched;
    SCOPED_TRACE(std::string(launched ? "interrupted under launch --nproc 2" : "interrupted in one process") +
                 (k.flags.empty() ? "" : ", --zero 1"));
    const std::string name = std::string(launched ? "resume-launch" : "resume-one") + (k.flags.empty() ? "" : "-zero");
    const auto dir = run_dir(name);
    const std::string checkpoint = (dir / "c.st").string();
    auto args = common({"--checkpoint", checkpoint});
    args.insert(args.end(), k.flags.begin(), k.flags.end());
    if (!launched) args.insert(args.end(), {"--link-bandwidth", "10Mbit"});
    args.erase(std::find(args.begin(), args.end(), "--quiet"));  // for the progress lines
    CliRun first(dir, launched ? launch_args(2, args) : args);
    ASSERT_TRUE(first.wait_for_err("step 5/3000")) << first.err();
    kill(first.pid(), SIGINT);
    ASSERT_EQ(first.wait(), 130) << first.err();
    ASSERT_TRUE(fs::exists(checkpoint));
    if (k.flags.empty()) finished = checkpoint;  // for the refusals below

    const auto again_dir = run_dir(name + "-again");
    auto again_args = common({"--resume", checkpoint, "--checkpoint", checkpoint, "--save",
                              (again_dir / "w.st").string(), "--report", (again_dir / "r.json").string()});
    again_args.insert(again_args.end(), k.flags.begin(), k.flags.end());
    CliRun again(again_dir, again_args);
    ASSERT_EQ(again.wait(), 0) << again.err();
    EXPECT_EQ(read_file(again_dir / "w.st"), want) << "the resumed run's weights differ from the unbroken run's";
    // Per step, over the steps this run made: as the unbroken run's.
    const auto a = nlohmann::json::parse(read_file(whole_dir / "r.json"))["bytes"];
    const auto b = nlohmann::json::parse(read_file(again_dir / "r.json"))["bytes"];
    if (k.flags.empty()) {
      for (const char* f : {"measured_gradient_bytes_sent_per_step_per_replica", "gradient_messages_per_step_per_replica"})
        EXPECT_EQ(a[f], b[f]) << f;
    } else {  // --zero 1 reduce-scatters instead; its checkpoints gather the shards to rank 0, counted apart
      const auto& sent = b["per_replica_sent"];
      ASSERT_EQ(sent.size(), 2u) << b.dump();
      EXPECT_GT(sent[1]["checkpoint"].get<std::uint64_t>(), 0u) << b.dump();
      for (const auto& replica : sent) EXPECT_EQ(replica["unaccounted"].get<std::uint64_t>(), 0u) << b.dump();
    }
    EXPECT_NE(again.out().find("resumed      from a checkpoint after step"), std::string::npos) << again.out();

    // The checkpoint now holds the finished run: --resume refuses it, --init takes its weights.
    auto ended_args = common({"--resume", checkpoint});
    ended_args.insert(ended_args.end(), k.flags.begin(), k.flags.end());
    CliRun ended(run_dir(name + "-ended"), ended_args);
    EXPECT_EQ(ended.wait(), 2) << ended.err();
    EXPECT_NE(ended.err().find("the checkpoint is of a run that had ended (step 3000 of 3000)"), std::string::npos)
        << ended.err();
  }
  const auto dir = run_dir("resume-refusals");
  const std::string& checkpoint = finished;
  // Its weights only: another optimizer may start from them.
  CliRun init(dir, train_args(data, {"--steps", "3", "--replicas", "2", "--optimizer", "adamw", "--init", checkpoint}));
  EXPECT_EQ(init.wait(), 0) << init.err();
  CliRun lr(run_dir("resume-lr"), train_args(data, {"--steps", "3000", "--replicas", "2", "--algorithm", "ring",
                                                     "--lr", "0.05", "--resume", checkpoint}));
  EXPECT_EQ(lr.wait(), 2) << lr.err();
  EXPECT_NE(lr.err().find("--resume: --lr differs from the run that wrote the checkpoint ('0.1' there, '0.05' here)"),
            std::string::npos)
      << lr.err();
  CliRun weights(run_dir("resume-weights"), common({"--resume", (whole_dir / "w.st").string()}));
  EXPECT_EQ(weights.wait(), 1) << weights.err();
  EXPECT_NE(weights.err().find("is not a lockstep checkpoint"), std::string::npos) << weights.err();
}

// launch --max-restarts with train --auto-resume (Note [Restarting the job],
// Note [Restarts]): rank 1 fails at step 25; the launcher starts the job
// again, which goes on from the checkpoint of step 24 and ends with the
// unbroken job's weights, bit for bit. A refused flag (exit 2) is not
// restarted; a failure that recurs is restarted until the restarts run out.
TEST_F(LaunchTrain, AFailedJobRestartedFromItsCheckpointEndsAsTheUnbrokenJob) {
  const auto data = make_data_dir("restart");
  const auto launch = [&](const std::vector<std::string>& restarts, const std::vector<std::string>& more) {
    std::vector<std::string> a = {"launch", "--nproc", "2"};
    a.insert(a.end(), restarts.begin(), restarts.end());
    a.push_back("--");
    const auto t = train_args(data, {"--steps", "40", "--checkpoint-every", "10"});
    a.insert(a.end(), t.begin(), t.end());
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const auto whole_dir = run_dir("restart-whole");
  CliRun whole(whole_dir, launch({}, {"--checkpoint", "c.st", "--save", "w.st"}));
  ASSERT_EQ(whole.wait(), 0) << whole.err();
  const std::string want = read_file(whole_dir / "w.st");
  ASSERT_FALSE(want.empty());

  const auto dir = run_dir("restart");
  CliRun r(dir, launch({"--max-restarts", "2"}, {"--checkpoint", "c.st", "--auto-resume", "--inject", "throw@25:1",
                                                 "--save", "w.st", "--report", "r.json"}));
  ASSERT_EQ(r.wait(), 0) << r.err();
  const std::string err = r.err();
  EXPECT_NE(err.find("[rank 1] lockstep: error: rank 1: injected failure at step 25"), std::string::npos) << err;
  EXPECT_NE(err.find("lockstep launch: rank 1 failed first: exit code 1; the other ranks were stopped. Restarting "
                     "the job (restart 1 of 2).\n"),
            std::string::npos)
      << err;
  EXPECT_EQ(r.last_err_line(), "lockstep launch: the job succeeded after 1 restart.") << err;
  EXPECT_EQ(read_file(dir / "w.st"), want) << "the restarted job's weights differ from the unbroken job's";
  // The last checkpoint before step 25: every 10 steps and at each epoch's end (12 steps of 2 x 4 here).
  const auto report = nlohmann::json::parse(read_file(dir / "r.json"));
  EXPECT_EQ(report["resumed_from_step"], 24);

  // A rank that fails after the last step, its checkpoint written (Note [A
  // job that had ended]): the job is restarted from its last step, runs no
  // step, and ends as the unbroken job, with its weights and their test
  // accuracy (the failed run wrote no output: rank 0 failed gathering them).
  const auto after_dir = run_dir("restart-after-the-last");
  CliRun after(after_dir, launch({"--max-restarts", "1"}, {"--checkpoint", "c.st", "--auto-resume", "--inject",
                                                           "throw@40:1", "--save", "w.st", "--report", "r.json"}));
  ASSERT_EQ(after.wait(), 0) << after.err();
  EXPECT_NE(after.err().find("injected failure at step 40"), std::string::npos) << after.err();
  EXPECT_NE(after.err().find("Restarting the job (restart 1 of 1)"), std::string::npos) << after.err();
  EXPECT_EQ(read_file(after_dir / "w.st"), want) << "the ended job's weights differ from the unbroken job's";
  const auto ended = nlohmann::json::parse(read_file(after_dir / "r.json"));
  EXPECT_EQ(ended["resumed_from_step"], 40);
  EXPECT_EQ(ended["test_accuracy"], report["test_accuracy"]);

  // The same failure with no restart (Note [Lost after the last step]): the
  // job fails, but rank 0 keeps what it trained: --save is the unbroken job's
  // weights; the report, which needs every rank, is not written.
  const auto lost_dir = run_dir("lost-after-the-last");
  CliRun lost(lost_dir,
              launch({}, {"--checkpoint", "c.st", "--inject", "throw@40:1", "--save", "w.st", "--report", "r.json"}));
  EXPECT_NE(lost.wait(), 0) << lost.err();
  EXPECT_NE(lost.err().find("a rank was lost after the last step, while the outputs were gathered; the weights it "
                            "trained to the end (compared across the ranks after the last step) are saved to w.st"),
            std::string::npos)
      << lost.err();
  EXPECT_EQ(read_file(lost_dir / "w.st"), want) << "the weights saved after the loss differ from the unbroken job's";
  EXPECT_FALSE(fs::exists(lost_dir / "r.json"));

  // Refused flags would be refused again: one run, not restarted.
  CliRun refused(run_dir("restart-refused"), launch({"--max-restarts", "2"}, {"--auto-resume"}));
  EXPECT_EQ(refused.wait(), 2) << refused.err();
  EXPECT_NE(refused.last_err_line().find("Not restarted: exit code 2 is a refused flag or setting"), std::string::npos)
      << refused.err();
  EXPECT_EQ(refused.err().find("Restarting"), std::string::npos) << refused.err();

  // A failure that comes back every time: restarted until the restarts run out.
  const auto missing = (run_dir("restart-missing") / "no-such-file.st").string();
  CliRun recurs(run_dir("restart-recurs"), launch({"--max-restarts", "1"}, {"--checkpoint", "c.st", "--init", missing}));
  EXPECT_EQ(recurs.wait(), 1) << recurs.err();
  EXPECT_NE(recurs.err().find("(restart 1 of 1)"), std::string::npos) << recurs.err();
  // Without --auto-resume each restart trains from step 0: said before the job starts.
  EXPECT_EQ(recurs.err().rfind("lockstep launch: warning: the command has no --auto-resume, so a restarted job trains "
                               "again from step 0",
                               0),
            0u)
      << recurs.err();
  EXPECT_EQ(r.err().find("warning"), std::string::npos) << r.err();
  EXPECT_NE(recurs.last_err_line().find("the other ranks were stopped, after 1 restart."), std::string::npos)
      << recurs.err();
}

// A signal to the launcher between two runs of a job ends it, not restarted,
// and says so (Note [Restarting the job]). The launcher is held there: its
// stderr is a pipe this test fills while the rank runs, so once the rank is
// killed the launcher blocks writing "Restarting the job", after the first
// run and before the second; SIGINT comes then. (The launcher once caught
// signals only while a run was under way: there SIGINT killed it without a
// word, and one that came as a run ended was lost, and the job restarted.)
TEST_F(LaunchTrain, ASignalBetweenTwoRunsOfAJobEndsItWithoutARestart) {
  const auto data = make_data_dir("restart-signal");
  const auto dir = run_dir("restart-signal");
  int err[2];
  ASSERT_EQ(pipe2(err, O_CLOEXEC), 0);
  std::vector<std::string> args = {LOCKSTEP_CLI, "launch", "--nproc", "1", "--max-restarts", "1", "--"};
  for (const auto& a : train_args(data, {"--steps", "1000000"})) args.push_back(a);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, (dir / "out.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  pid_t launcher = -1;
  ASSERT_EQ(posix_spawn(&launcher, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  const auto deadline = Clock::now() + std::chrono::seconds(60);  // the wall-clock guard
  std::string text;
  const auto read_some = [&] {  // false once the launcher's stderr is closed
    pollfd p{err[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) return true;
    char buf[4096];
    const ssize_t n = read(err[0], buf, sizeof buf);
    if (n > 0) text.append(buf, std::size_t(n));
    return n > 0;
  };
  const auto stop = [&](const std::string& why) {
    kill(launcher, SIGKILL);
    waitpid(launcher, nullptr, 0);
    close(err[0]);
    close(err[1]);
    ADD_FAILURE() << why << "\n" << text;
  };
  while (text.find("), pids ") == std::string::npos || text.back() != '\n') {
    if (Clock::now() > deadline) return stop("the rank did not start");
    read_some();
  }
  const pid_t rank = std::stoi(text.substr(text.find("), pids ") + 8));
  // Fill the pipe through a description of its own (O_NONBLOCK would be the launcher's too).
  const int fill = open(("/proc/self/fd/" + std::to_string(err[1])).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(fill, 0);
  const std::string page(4096, '.');
  for (std::size_t size : {std::size_t(4096), std::size_t(1)})
    while (write(fill, page.data(), size) > 0) {
    }
  close(fill);
  close(err[1]);
  kill(rank, SIGKILL);
  // The launcher has reaped the rank and waits to write why it restarts.
  for (;;) {
    if (Clock::now() > deadline) return stop("the launcher did not block writing to its stderr");
    const std::string wchan = read_file("/proc/" + std::to_string(launcher) + "/wchan");  // "[anon_]pipe_write"
    if (wchan.ends_with("pipe_write") && gone(rank)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(launcher, SIGINT);
  while (read_some()) {
    if (Clock::now() > deadline) return stop("the launcher did not end");
  }
  close(err[0]);
  int status = 0;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
  if (const auto filler = text.find(std::string(64, '.')); filler != std::string::npos)
    text.erase(0, text.find_first_not_of('.', filler));
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << "\n" << text;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << text;
  EXPECT_NE(text.find("lockstep launch: interrupted by signal 2 (SIGINT) before restart 1 of 1; the job was not "
                      "restarted.\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("), pids "), std::string::npos) << "the job was started again:\n" << text;
}

// Only commands that join the group are one job; anything else would run N
// independent copies. Refused before any process starts.
// A group of one rank has no all-reduce to time (Cli.BenchAllreduceRefusesOneReplica).
TEST_F(LaunchTrain, BenchAllreduceOfOneRankIsRefused) {
  CliRun one(run_dir("bench_one"), launch_args(1, {"bench", "allreduce", "--sizes", "4K", "--repeats", "1"}));
  EXPECT_EQ(one.wait(), 2) << one.err();
  EXPECT_NE(one.err().find("needs a process group of 2 or more ranks"), std::string::npos) << one.err();
  EXPECT_EQ(one.out().find("time_us"), std::string::npos) << "measured before refusing:\n" << one.out();
}

TEST_F(LaunchTrain, CommandsThatDoNotJoinTheGroupAreRefused) {
  const auto data = make_data_dir("refused");
  CliRun plan(run_dir("plan"), launch_args(2, {"plan"}));
  EXPECT_EQ(plan.wait(), 2);
  EXPECT_NE(plan.err().find("'plan' would run 2 independent copies"), std::string::npos) << plan.err();
  // Not a command at all: named as such (it read "'bogus' would run 1 independent copies").
  CliRun bogus(run_dir("bogus"), launch_args(1, {"bogus"}));
  EXPECT_EQ(bogus.wait(), 2);
  EXPECT_NE(bogus.err().find("launch: 'bogus' is not a lockstep command; give train or bench allreduce after --"),
            std::string::npos)
      << bogus.err();
  CliRun threads(run_dir("threads"), launch_args(2, train_args(data, {"--steps", "1", "--backend", "threads"})));
  EXPECT_EQ(threads.wait(), 2);
  EXPECT_NE(threads.err().find("the command asks for --backend threads"), std::string::npos) << threads.err();
  EXPECT_EQ(threads.err().find("lockstep launch: 2 processes"), std::string::npos) << "started:\n" << threads.err();
  // The memory check counts every rank on the host (LOCAL_WORLD_SIZE), not
  // one: a model that fits once but not twice is refused on both ranks.
  // Sized from this machine's free memory: one rank's weights, gradients and
  // momentum take 0.6 of it.
  std::ifstream meminfo("/proc/meminfo");
  double available_kb = 0;
  for (std::string key; meminfo >> key;) {
    if (key == "MemAvailable:") meminfo >> available_kb;
    meminfo.ignore(1 << 10, '\n');
  }
  ASSERT_GT(available_kb, 0);
  const auto width = std::to_string(std::int64_t(std::sqrt(0.6 * available_kb * 1024 / (4 * 3))));
  const auto hidden = width + "," + width;  // the width^2 weights between the two layers dominate
  CliRun twice(run_dir("twice"), launch_args(2, {"train", "--data", data.string(), "--steps", "1", "--quiet",
                                                  "--micro-batch", "4", "--hidden", hidden}));
  EXPECT_EQ(twice.wait(), 2) << twice.err();
  EXPECT_NE(twice.err().find("GB for 2 replicas' weights, gradients and optimizer state"), std::string::npos)
      << twice.err();
  // What launch sets for each rank: refused before anything starts (a
  // --world-size 3 waited the whole rendezvous timeout for a third rank).
  for (const auto& [flag, value] : {std::pair<std::string, std::string>{"--world-size", "3"},
                                    {"--rank", "1"},
                                    {"--rendezvous", "file:" + run_dir("elsewhere").string()}}) {
    CliRun own(run_dir("own"), launch_args(2, train_args(data, {"--steps", "1", flag, value})));
    EXPECT_EQ(own.wait(), 2) << flag;
    EXPECT_NE(own.err().find("launch sets " + flag + " for every rank"), std::string::npos) << own.err();
  }
  // bench allreduce joins; --replicas may only agree with the world size, as in train.
  CliRun bench(run_dir("bench"), launch_args(2, {"bench", "allreduce", "--sizes", "4K", "--replicas", "8"}));
  EXPECT_NE(bench.wait(), 0);
  EXPECT_NE(bench.err().find("--replicas 8 does not match the world size 2"), std::string::npos) << bench.err();
  CliRun agreeing(run_dir("bench2"), launch_args(2, {"bench", "allreduce", "--sizes", "4K,1M", "--replicas", "2",
                                                     "--repeats", "1", "--json"}));
  EXPECT_EQ(agreeing.wait(), 0) << agreeing.err();
  // Over processes, auto is halving-doubling for small buffers and the ring for large ones.
  const auto rows = nlohmann::json::parse(agreeing.out());
  ASSERT_EQ(rows.size(), 2u) << agreeing.out();
  EXPECT_EQ(rows[0]["algorithm_run"], "halving_doubling");
  EXPECT_EQ(rows[1]["algorithm_run"], "ring");
}

}  // namespace
