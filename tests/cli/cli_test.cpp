// The command-line tool as a user meets it: exit codes and messages for bad
// input, and a real (tiny) training run end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lockstep/data/idx.h"

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int code = -1;
  std::string output;  // stdout and stderr
};

CliRun run(const std::string& args) {
  const std::string cmd = std::string(LOCKSTEP_CLI) + " " + args + " 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// A tiny IDX data set: 64 train and 16 test images of 4x4, 3 classes.
fs::path make_data_dir(const std::string& name) {
  const fs::path dir = fs::path(LOCKSTEP_TEST_TMPDIR) / name;
  fs::create_directories(dir);
  auto write = [&](const std::string& file, std::int64_t n, bool images) {
    std::vector<std::uint8_t> bytes;
    for (std::int64_t i = 0; i < n * (images ? 16 : 1); ++i)
      bytes.push_back(std::uint8_t(images ? (i * 37) % 256 : i % 3));
    std::vector<std::int64_t> dims =
        images ? std::vector<std::int64_t>{n, 4, 4} : std::vector<std::int64_t>{n};
    lockstep::data::write_idx(dir / file, 0x08, dims, bytes, true);
  };
  write("train-images-idx3-ubyte.gz", 64, true);
  write("train-labels-idx1-ubyte.gz", 64, false);
  write("t10k-images-idx3-ubyte.gz", 16, true);
  write("t10k-labels-idx1-ubyte.gz", 16, false);
  return dir;
}

TEST(Cli, HelpShowsDefaults) {
  const CliRun r = run("train --help");
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"--replicas", "--micro-batch", "--hidden", "512,512", "--optimizer", "sgd", "--lr"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s;
}

TEST(Cli, UnknownFlagIsAUsageError) {
  const CliRun r = run("train --no-such-flag");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
}

TEST(Cli, ImpossibleValuesAreUsageErrors) {
  EXPECT_EQ(run("train --replicas 0").code, 2);
  EXPECT_EQ(run("train --micro-batch 0").code, 2);
  EXPECT_EQ(run("train --hidden 512,,3").code, 2);
  const auto dir = make_data_dir("small");
  const CliRun big = run("train --data " + dir.string() + " --micro-batch 100 --steps 1");
  EXPECT_EQ(big.code, 2);
  EXPECT_NE(big.output.find("larger than the data set"), std::string::npos) << big.output;
}

TEST(Cli, MissingDataDirectoryNamesIt) {
  const CliRun r = run("train --data /nonexistent/lockstep-data --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("/nonexistent/lockstep-data"), std::string::npos) << r.output;
}

TEST(Cli, GarbageIdxFileIsNamed) {
  const auto dir = make_data_dir("garbage");
  std::ofstream(dir / "train-images-idx3-ubyte.gz", std::ios::trunc) << "this is not an idx file";
  const CliRun r = run("train --data " + dir.string() + " --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("train-images-idx3-ubyte.gz"), std::string::npos) << r.output;
}

TEST(Cli, BadSafetensorsInitIsNamed) {
  const auto dir = make_data_dir("badinit");
  const fs::path bad = dir / "bad.safetensors";
  std::ofstream(bad) << "garbage";
  const CliRun r = run("train --data " + dir.string() + " --steps 1 --init " + bad.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("bad.safetensors"), std::string::npos) << r.output;
}

TEST(Cli, UnwritableSaveFailsBeforeTraining) {
  const auto dir = make_data_dir("unwritable");
  const CliRun r = run("train --data " + dir.string() + " --steps 1 --save /nonexistent/dir/w.safetensors");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("/nonexistent/dir"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "trained before failing";
  // A directory where a file is wanted: refused before training, not after.
  const CliRun d = run("train --data " + dir.string() + " --steps 1 --save " + dir.string());
  EXPECT_EQ(d.code, 2);
  EXPECT_NE(d.output.find("is a directory"), std::string::npos) << d.output;
  EXPECT_EQ(run("train --data " + dir.string() + " --steps 1 --timeout 1e12").code, 2);
}

TEST(Cli, TinyRunWritesReportAndWeightsThatReload) {
  const auto dir = make_data_dir("run");
  const fs::path report = dir / "report.json", weights = dir / "w.safetensors";
  const std::string common =
      "train --data " + dir.string() + " --replicas 4 --micro-batch 4 --hidden 8 --quiet";
  const CliRun r = run(common + " --steps 6 --report " + report.string() + " --save " + weights.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("replicated"), std::string::npos);
  EXPECT_NE(r.output.find("communicated"), std::string::npos);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(report));
  EXPECT_EQ(j["replicas"], 4);
  EXPECT_EQ(j["micro_batch"], 4);
  EXPECT_EQ(j["global_batch"], 16);
  EXPECT_EQ(j["steps"], 6);
  for (const char* k : {"final_loss", "test_accuracy", "samples_per_s", "mfu"})
    EXPECT_TRUE(j.contains(k)) << k;
  const std::uint64_t p = (16 * 8 + 8 + 8 * 3 + 3) * 4;  // MLP 16-8-3 in bytes
  EXPECT_EQ(j["bytes"]["weights_per_replica"], p);
  EXPECT_EQ(j["bytes"]["grads_per_replica"], p);
  EXPECT_EQ(j["bytes"]["optimizer_state_per_replica"], p);
  EXPECT_EQ(j["bytes"]["allreduce_per_step_per_replica"], 2 * p * 3 / 4);
  EXPECT_EQ(j["bytes"]["weights_exchanged_after_init"], 0);
  EXPECT_EQ(j["bytes"]["activations_communicated"], 0);
  // The saved weights load back as --init.
  EXPECT_EQ(run(common + " --steps 1 --init " + weights.string()).code, 0);
  // And a model of another shape refuses them, naming a tensor.
  const CliRun other =
      run("train --data " + dir.string() + " --hidden 9 --steps 1 --init " + weights.string());
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.output.find("0.weight"), std::string::npos) << other.output;
}

}  // namespace
