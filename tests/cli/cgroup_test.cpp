// cli/cgroup.h: a container's CPU and memory limits, read from cgroup v2 and
// v1 trees of the test's own making (as /sys/fs/cgroup and /proc/self/cgroup).
#include "cgroup.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;

class Cgroup : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(LOCKSTEP_TEST_TMPDIR) / ("cgroup_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(mount());
  }
  fs::path mount() const { return root_ / "sys_fs_cgroup"; }
  fs::path self() const { return root_ / "proc_self_cgroup"; }
  void write(const fs::path& file, const std::string& text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  fs::path root_;
};

TEST(CpuList, ReadsRangesAndRefusesWhatIsNotAList) {
  EXPECT_EQ(parse_cpu_list("0-3,8"), (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_EQ(parse_cpu_list("0,2-3"), (std::vector<int>{0, 2, 3}));
  for (const char* bad : {"", "0-", "3-1", "a", "1,,2", "-1", "0-99999"}) EXPECT_TRUE(parse_cpu_list(bad).empty()) << bad;
}

TEST(CpuList, AQuotaRoundsUpAndNeverLeavesNoCore) {
  EXPECT_EQ(cores_within_quota(64, 0), 64);    // no quota
  EXPECT_EQ(cores_within_quota(64, 1.5), 2);   // one and a half CPUs' time keeps two busy
  EXPECT_EQ(cores_within_quota(64, 2.0), 2);
  EXPECT_EQ(cores_within_quota(64, 0.2), 1);
  EXPECT_EQ(cores_within_quota(2, 8), 2);      // a quota over the cpuset: the cpuset
  EXPECT_EQ(cores_within_quota(0, 0), 1);
}

// Each level's limit holds: the cpuset of the nearest cgroup that has one,
// the smallest quota, the least memory left.
TEST_F(Cgroup, TheLimitsOfItsCgroupAndThoseAboveIt) {
  write(self(), "0::/job/step\n");
  write(mount() / "cpu.max", "max 100000\n");  // the root's: none
  write(mount() / "job" / "cpu.max", "150000 100000\n");
  write(mount() / "job" / "memory.max", "4000000000\n");
  write(mount() / "job" / "memory.current", "1000000000\n");
  write(mount() / "job" / "cpuset.cpus.effective", "0-63\n");
  write(mount() / "job" / "step" / "cpuset.cpus.effective", "4-7\n");
  write(mount() / "job" / "step" / "cpu.max", "400000 100000\n");
  write(mount() / "job" / "step" / "memory.max", "max\n");
  write(mount() / "job" / "step" / "memory.current", "500000000\n");
  const CgroupLimits l = read_cgroup_limits(mount(), self());
  EXPECT_EQ(l.cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_DOUBLE_EQ(l.cpu_quota, 1.5);
  EXPECT_DOUBLE_EQ(l.memory_free, 3e9);
  // A lower limit below: the least wins.
  write(mount() / "job" / "step" / "memory.max", "1000000000\n");
  EXPECT_DOUBLE_EQ(read_cgroup_limits(mount(), self()).memory_free, 5e8);
  // The inactive page cache is reclaimed before the limit bites: free.
  write(mount() / "job" / "step" / "memory.stat", "anon 100\nactive_file 7\ninactive_file 200000000\n");
  EXPECT_DOUBLE_EQ(read_cgroup_limits(mount(), self()).memory_free, 7e8);
  // Used past its limit (it can be, briefly): nothing free, not negative.
  write(mount() / "job" / "step" / "memory.stat", "");
  write(mount() / "job" / "step" / "memory.current", "2000000000\n");
  EXPECT_DOUBLE_EQ(read_cgroup_limits(mount(), self()).memory_free, 0);
}

TEST_F(Cgroup, NoLimitsSetMeansNone) {
  write(self(), "0::/\n");
  write(mount() / "cpu.max", "max 100000\n");
  const CgroupLimits l = read_cgroup_limits(mount(), self());
  EXPECT_TRUE(l.cpus.empty());
  EXPECT_EQ(l.cpu_quota, 0);
  EXPECT_LT(l.memory_free, 0);
}

// cgroup v1, one hierarchy per controller (as on this project's VM): the same
// limits from v1's files, each controller's path its own.
TEST_F(Cgroup, CgroupV1ControllersEachUnderTheirOwnFolder) {
  write(self(), "12:pids:/\n4:memory:/api/job\n3:cpuset:/pinned\n2:cpu,cpuacct:/job\n1:name=systemd:/\n0::/\n");
  write(mount() / "memory" / "memory.limit_in_bytes", "9223372036854771712\n");  // the root's: none
  write(mount() / "memory" / "api" / "memory.limit_in_bytes", "8000000000\n");
  write(mount() / "memory" / "api" / "memory.usage_in_bytes", "1000000000\n");
  write(mount() / "memory" / "api" / "job" / "memory.limit_in_bytes", "9223372036854771712\n");
  write(mount() / "memory" / "api" / "job" / "memory.usage_in_bytes", "500000000\n");
  write(mount() / "cpuset" / "cpuset.effective_cpus", "0-15\n");
  write(mount() / "cpuset" / "pinned" / "cpuset.effective_cpus", "2,4\n");
  // cpu and cpuacct share a hierarchy, with no folder named "cpu".
  write(mount() / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n");
  write(mount() / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n");
  write(mount() / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us", "250000\n");
  write(mount() / "cpu,cpuacct" / "job" / "cpu.cfs_period_us", "100000\n");
  const CgroupLimits l = read_cgroup_limits(mount(), self());
  EXPECT_EQ(l.cpus, (std::vector<int>{2, 4}));
  EXPECT_DOUBLE_EQ(l.cpu_quota, 2.5);
  EXPECT_DOUBLE_EQ(l.memory_free, 7e9);
  write(mount() / "memory" / "api" / "memory.stat", "cache 9\ninactive_file 5\ntotal_inactive_file 1000000000\n");
  EXPECT_DOUBLE_EQ(read_cgroup_limits(mount(), self()).memory_free, 8e9);  // v1's total_ counts the ones below
  // With a link per controller ("cpu" -> "cpu,cpuacct"), the same.
  fs::create_directory_symlink("cpu,cpuacct", mount() / "cpu");
  EXPECT_DOUBLE_EQ(read_cgroup_limits(mount(), self()).cpu_quota, 2.5);
}

// No /proc/self/cgroup, or one that names no cgroup: no limits.
TEST_F(Cgroup, NoCgroupNoLimits) {
  write(mount() / "cpu.max", "100000 100000\n");
  EXPECT_EQ(read_cgroup_limits(mount(), root_ / "no_such_file").cpu_quota, 0);
  write(self(), "garbage\n");
  EXPECT_EQ(read_cgroup_limits(mount(), self()).cpu_quota, 0);
}

// A container without a cgroup namespace sees its path from the host's root,
// and its own cgroup mounted as the root: the mount's limits are its own.
TEST_F(Cgroup, APathNotUnderTheMountReadsTheMount) {
  write(self(), "0::/system.slice/docker-abc.scope\n");
  write(mount() / "cpu.max", "200000 100000\n");
  write(mount() / "cpuset.cpus.effective", "2-3\n");
  const CgroupLimits l = read_cgroup_limits(mount(), self());
  EXPECT_DOUBLE_EQ(l.cpu_quota, 2.0);
  EXPECT_EQ(l.cpus, (std::vector<int>{2, 3}));
  // Outside this namespace's root ("/../x"): the mount's, not a cgroup x
  // below the mount that happens to have that name.
  write(mount() / "x" / "cpu.max", "50000 100000\n");
  write(self(), "0::/../x\n");
  EXPECT_DOUBLE_EQ(read_cgroup_limits(mount(), self()).cpu_quota, 2.0);
  write(self(), "0::/x\n");
  EXPECT_DOUBLE_EQ(read_cgroup_limits(mount(), self()).cpu_quota, 0.5);
}

}  // namespace
}  // namespace lockstep::cli
