// The command-line tool as a user meets it: exit codes and messages for bad
// input, and a real (tiny) training run end to end.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "lockstep/data/idx.h"
#include "lockstep/nn/safetensors.h"
#include "lockstep/version.h"

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int code = -1;
  std::string output;  // stdout and stderr
};

// For tests that train several times and do not look at MFU: a stated peak,
// so that each run does not measure one (0.15 s of every core). Cli.PeakGflops...
// and TinyRunWritesReport... check both ways.
const std::string kStatedPeak = " --peak-gflops 100 ";

CliRun run_command(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

CliRun run(const std::string& args) {
  std::string command = LOCKSTEP_CLI;  // appended, not operator+: GCC 12 -Warray-bounds misreads that inlined
  command += ' ';
  command += args;
  return run_command(command);
}

// run() under timeout(1): for a command that used to block for good (124 then).
CliRun run_bounded(const std::string& args) {
  return run_command("timeout 60 " + std::string(LOCKSTEP_CLI) + " " + args);
}

// A tiny IDX data set: `train` (64) train and 16 test images of `side` x
// `side` (4x4), `classes` (3) classes (labels i mod classes; with
// `stray_label`, the first train label is that instead).
fs::path make_data_dir(const std::string& name, std::int64_t train = 64, std::uint8_t stray_label = 0,
                       std::int64_t side = 4, int classes = 3) {
  const fs::path dir = fs::path(LOCKSTEP_TEST_TMPDIR) / name;
  fs::remove_all(dir);  // nothing from an earlier run (a file a broken build wrote there)
  fs::create_directories(dir);
  auto write = [&](const std::string& file, std::int64_t n, bool images) {
    std::vector<std::uint8_t> bytes;
    for (std::int64_t i = 0; i < n * (images ? side * side : 1); ++i)
      bytes.push_back(std::uint8_t(images ? (i * 37) % 256 : i % classes));
    if (!images && stray_label != 0 && file.rfind("train", 0) == 0) bytes[0] = stray_label;
    std::vector<std::int64_t> dims =
        images ? std::vector<std::int64_t>{n, side, side} : std::vector<std::int64_t>{n};
    lockstep::data::write_idx(dir / file, 0x08, dims, bytes, true);
  };
  write("train-images-idx3-ubyte.gz", train, true);
  write("train-labels-idx1-ubyte.gz", train, false);
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

// The build that ranks of a group compare (Note [One build per group]) is
// what --version prints and what a report records.
TEST(Cli, VersionAndReportNameTheBuild) {
  const std::string build = lockstep::build_id();
  const CliRun v = run("--version");
  EXPECT_EQ(v.code, 0) << v.output;
  const std::string version = lockstep::version();
  ASSERT_EQ(build.substr(0, version.size() + 1), version + "+") << build;
  EXPECT_TRUE(std::regex_match(build.substr(version.size() + 1), std::regex("[0-9a-f]{12}"))) << build;
  const std::string head = "lockstep " + version + " (build " + build + ", commit ";
  ASSERT_EQ(v.output.substr(0, head.size()), head) << v.output;
  EXPECT_TRUE(std::regex_match(v.output.substr(head.size()), std::regex("([0-9a-f]{12}(-dirty)?|unknown)\\)\n")))
      << v.output;
  const fs::path dir = make_data_dir("cli_version_build");
  const fs::path report = dir / "r.json";
  const CliRun r = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 --quiet --report " +
                       report.string() + kStatedPeak);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(report))["build"], build);
}

// --optimizer adamw takes torch.optim.AdamW's defaults (lr 0.001, weight
// decay 0.01) unless given; sgd keeps torch.optim.SGD's (weight decay 0).
TEST(Cli, OptimizerDefaultsArePyTorchs) {
  const fs::path dir = make_data_dir("cli_optimizer_defaults");
  const auto config = [&](const std::string& flags) {
    const fs::path report = dir / "r.json";
    const CliRun r = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 --quiet --report " +
                         report.string() + kStatedPeak + flags);
    EXPECT_EQ(r.code, 0) << flags << ":\n" << r.output;
    return nlohmann::json::parse(std::ifstream(report))["config"];
  };
  EXPECT_FLOAT_EQ(config("--optimizer adamw")["weight_decay"].get<float>(), 0.01f);
  EXPECT_FLOAT_EQ(config("--optimizer adamw")["lr"].get<float>(), 0.001f);
  EXPECT_FLOAT_EQ(config("--optimizer adamw --weight-decay 0")["weight_decay"].get<float>(), 0.0f);
  EXPECT_FLOAT_EQ(config("--optimizer sgd")["weight_decay"].get<float>(), 0.0f);
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

// Every numeric flag says what it expected and what it got, and refuses nan,
// inf and numbers that overflow instead of taking them.
TEST(Cli, NumbersOutOfRangeNameWhatWasExpected) {
  for (const char* args : {"train --momentum nan", "train --weight-decay nan", "train --timeout nan",
                           "train --lr 0", "train --lr inf", "train --seed -1",
                           "train --steps 99999999999999999999", "train --bucket-mb -1",
                           "plan --compute-ms nan", "plan --price inf", "launch --nproc 2 --rendezvous-timeout nan -- train",
                           "train --steps 0x10", "train --seed 1.5", "train --seed 18446744073709551616"}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("expected a"), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("179769313486231570"), std::string::npos) << args << "\n" << r.output;
  }
  const CliRun lr = run("train --lr 0");
  EXPECT_NE(lr.output.find("--lr: expected a positive number"), std::string::npos) << lr.output;
}

// A number too small for a double ("1e-400") is not 0: strtod reads it as 0
// (with ERANGE), which --clip-grad-norm and --peak-gflops take as "off" and
// --bucket-mb as one bucket; bench allreduce timed it as 0 bytes.
TEST(Cli, NumbersThatUnderflowAreRefusedNotReadAsZero) {
  for (const char* args : {"train --clip-grad-norm 1e-400", "train --peak-gflops 1e-400", "train --bucket-mb 1e-400",
                           "train --momentum 1e-400", "plan --bucket-mb 1e-400", "plan --critical-batch 1e-400",
                           "bench train --peak-gflops 1e-400"}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("expected "), std::string::npos) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("got '1e-400'"), std::string::npos) << args << "\n" << r.output;
  }
  const CliRun sizes = run("bench allreduce --replicas 2 --repeats 1 --sizes 4K,1e-400");
  EXPECT_EQ(sizes.code, 2) << sizes.output;
  EXPECT_NE(sizes.output.find("--sizes: cannot read '1e-400'"), std::string::npos) << sizes.output;
  // A double but not a float32 (the optimizer's settings are floats): it
  // trained with 0 and reported 0.0. And hex or a leading space, which
  // strtod reads ("--lr 0x10" trained at 16) and whole-number flags refuse.
  for (const char* args : {"train --weight-decay 1e-50", "train --momentum 1e-50", "train --lr 0x10",
                           "train --timeout 0x10", "train --lr ' 1'", "plan --price 0x1p3"}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("expected "), std::string::npos) << args << "\n" << r.output;
  }
}

// An empty process-group value is refused, not read as the flag left out:
// --secret-file "" (an unset $VAR) ran the job without a secret, and --bind ""
// listened on the default address, both with exit 0.
TEST(Cli, EmptyProcessGroupValuesAreRefused) {
  const fs::path dir = make_data_dir("cli_empty_group_values");
  const std::string common = "train --data " + dir.string() + " --micro-batch 8 --steps 1 --quiet" + kStatedPeak +
                             "--backend gloo --world-size 1 --rank 0 --rendezvous-timeout 5 ";
  int i = 0;
  for (const char* flag : {"--secret-file", "--bind", "--job-id", "--rendezvous"}) {
    const std::string rendezvous =
        std::string(flag) == "--rendezvous" ? "" : "--rendezvous file:" + (dir / ("rdv" + std::to_string(i++))).string();
    const CliRun r = run_bounded(common + rendezvous + " " + flag + " ''");
    EXPECT_EQ(r.code, 2) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find(std::string(flag) + ": needs a value"), std::string::npos) << flag << "\n" << r.output;
  }
  // A file rendezvous naming a file, not a directory: said so, with the
  // remedy (it failed on a hashed key path inside it, "Not a directory").
  const fs::path file = dir / "not_a_directory";
  std::ofstream(file) << "x";
  const CliRun r = run_bounded(common + "--rendezvous file:" + file.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(file.string() + " is not a directory; give file:DIR"), std::string::npos) << r.output;
}

// LOCKSTEP_MEMORY_AVAILABLE that is not a number of bytes ("16G") was
// ignored without a word, and the memory checks ran against the figure it
// was set to correct.
TEST(Cli, MemoryOverrideThatIsNotBytesIsRefused) {
  const fs::path dir = make_data_dir("cli_memory_override");
  for (const char* value : {"16G", "abc", "-1", "nan"}) {
    ::setenv("LOCKSTEP_MEMORY_AVAILABLE", value, 1);
    const CliRun r = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 --quiet" + kStatedPeak);
    const CliRun sizes = run("bench allreduce --replicas 2 --sizes 4K --repeats 1");
    ::unsetenv("LOCKSTEP_MEMORY_AVAILABLE");
    for (const CliRun* c : {&r, &sizes}) {
      EXPECT_EQ(c->code, 2) << value << "\n" << c->output;
      EXPECT_NE(c->output.find(std::string("LOCKSTEP_MEMORY_AVAILABLE is '") + value + "', not a number of bytes"),
                std::string::npos)
          << value << "\n" << c->output;
    }
  }
}

// A checkpoint of another format version says what to do, not only what is
// wrong (found by a sweep of hostile --resume files).
TEST(Cli, CheckpointOfAnotherVersionSaysWhatToDo) {
  const fs::path dir = make_data_dir("cli_checkpoint_version");
  for (const char* version : {"2", ""}) {
    const fs::path file = dir / "c.st";
    std::map<std::string, std::string> metadata{{"format", "lockstep-checkpoint"}};
    if (*version != '\0') metadata["version"] = version;
    lockstep::nn::save_safetensors(file, {}, metadata, "the checkpoint");
    const CliRun r = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 --quiet --resume " +
                         file.string() + kStatedPeak);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("is not one this build reads (1); resume it with the lockstep build that wrote it, or "
                            "start afresh without --resume."),
              std::string::npos)
        << r.output;
  }
}

// Whole numbers are decimal: "010" is ten (not octal eight), and a seed takes
// the whole unsigned 64-bit range.
TEST(Cli, WholeNumbersAreReadInBaseTen) {
  const fs::path dir = make_data_dir("cli_base_ten");
  const fs::path report = dir / "r.json";
  const CliRun r = run("train --data " + dir.string() + " --replicas 2 --micro-batch 2 --steps 010 --seed " +
                       "18446744073709551615 --report " + report.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(std::ifstream(report));
  EXPECT_EQ(j["steps"].get<std::int64_t>(), 10);
  EXPECT_EQ(j["config"]["seed"].get<std::uint64_t>(), 18446744073709551615ull) << j.dump();
}

// --zero is a whole number like the others: CLI11's own conversion said
// "Could not convert: --zero = 1.5" (train) or only "--zero: 1.5" (plan,
// bench train), read train's 010 as octal 8 and took '' as stage 0.
TEST(Cli, ZeroStageIsAWholeNumberInBaseTen) {
  for (const char* args : {"train --zero 1.5", "train --zero abc", "train --zero nan", "train --zero ''",
                           "plan --zero 1.5", "plan --zero -1", "plan --zero ''", "bench train --zero 1.5",
                           "bench train --zero 2"}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("--zero: expected a whole number from 0 to"), std::string::npos) << args << "\n"
                                                                                            << r.output;
  }
  const CliRun octal = run("train --zero 010");
  EXPECT_EQ(octal.code, 2) << octal.output;
  EXPECT_NE(octal.output.find("got '010'"), std::string::npos) << octal.output;
  EXPECT_EQ(octal.output.find("--zero 8"), std::string::npos) << octal.output;
  // Stages 2 and 3 still meet the trainer's own message.
  const CliRun two = run("train --zero 2");
  EXPECT_EQ(two.code, 2) << two.output;
  EXPECT_NE(two.output.find("every lockstep plan prices them"), std::string::npos) << two.output;
}

TEST(Cli, UnknownCommandsAndRepeatedFlagsAreNamed) {
  const CliRun top = run("nope");
  EXPECT_EQ(top.code, 2);
  EXPECT_NE(top.output.find("unknown command 'nope'"), std::string::npos) << top.output;
  EXPECT_NE(top.output.find("train, bench, demo, plan, launch"), std::string::npos) << top.output;
  const CliRun bench = run("bench nope");
  EXPECT_EQ(bench.code, 2);
  EXPECT_NE(bench.output.find("unknown command 'nope' for lockstep bench"), std::string::npos) << bench.output;
  const CliRun twice = run("train --replicas 2 --replicas 3");
  EXPECT_EQ(twice.code, 2);
  EXPECT_NE(twice.output.find("--replicas was given more than once"), std::string::npos) << twice.output;
}

// Two outputs naming one file would leave only the last: refused up front,
// and the user's file is untouched.
TEST(Cli, OutputsNamingOneFileAreRefusedAndTheFileIsKept) {
  const fs::path dir = make_data_dir("cli_same_output");
  const fs::path file = dir / "mine.bin";
  std::ofstream(file) << "the user's weights";
  const CliRun r = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 --save " +
                       file.string() + " --report " + (dir / "." / "mine.bin").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--save and --report both name"), std::string::npos) << r.output;
  std::ifstream in(file);
  const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "the user's weights");
  // A file that does not exist yet, spelled two ways (relative and ./, relative and absolute).
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  const CliRun fresh = run("train --data . --replicas 2 --micro-batch 8 --steps 1 --save ./new.st --timeline-svg new.st");
  const CliRun absolute = run("train --data . --replicas 2 --micro-batch 8 --steps 1 --report new.json --trace " +
                              (dir / "new.json").string());
  fs::current_path(cwd);
  EXPECT_EQ(fresh.code, 2) << fresh.output;
  EXPECT_NE(fresh.output.find("--save and --timeline-svg both name"), std::string::npos) << fresh.output;
  EXPECT_EQ(absolute.code, 2) << absolute.output;
  EXPECT_NE(absolute.output.find("--report and --trace both name"), std::string::npos) << absolute.output;
  EXPECT_FALSE(fs::exists(dir / "new.st"));
  EXPECT_FALSE(fs::exists(dir / "new.json"));
  // A dangling link is where it leads: --report through it would have
  // written b.st, and --save then replaced it (the weights lost).
  fs::remove(dir / "dangling");
  fs::create_symlink("b.st", dir / "dangling");
  const CliRun link = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 --report " +
                          (dir / "dangling").string() + " --save " + (dir / "b.st").string());
  EXPECT_EQ(link.code, 2) << link.output;
  EXPECT_NE(link.output.find("--save and --report both name"), std::string::npos) << link.output;
  EXPECT_FALSE(fs::exists(dir / "b.st"));
  // One pipe twice is one stream, the report and the trace run together; a
  // device such as /dev/null twice harms nothing.
  const CliRun pipe = run("train --data " + dir.string() +
                          " --replicas 2 --micro-batch 8 --steps 1 --report /dev/stdout --trace /dev/stdout 2>&1 | cat");
  EXPECT_NE(pipe.output.find("--report and --trace both name /dev/stdout"), std::string::npos) << pipe.output;
  const CliRun null = run("train --data " + dir.string() +
                          " --replicas 2 --micro-batch 8 --steps 1 --report /dev/null --trace /dev/null");
  EXPECT_EQ(null.code, 0) << null.output;
  // An output on standard output takes it: the summary goes to standard
  // error, and `--report /dev/stdout | jq` reads the JSON alone.
  const CliRun json = run_command("(" + std::string(LOCKSTEP_CLI) + " train --data " + dir.string() +
                                  " --replicas 2 --micro-batch 8 --steps 1 --report /dev/stdout 2>/dev/null | cat)");
  EXPECT_EQ(json.code, 0) << json.output;
  EXPECT_TRUE(nlohmann::json::accept(json.output)) << json.output;
  EXPECT_EQ(json.output.find("replicated"), std::string::npos) << json.output;
}

// An output that names one of the run's inputs (by any path: ./x, a
// symlink) would destroy it: refused before training, and the input is kept.
TEST(Cli, OutputsNamingAnInputAreRefusedAndTheInputIsKept) {
  const fs::path dir = make_data_dir("cli_output_input");
  const std::string common = "train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1" + kStatedPeak;
  const fs::path weights = dir / "w.safetensors";
  ASSERT_EQ(run(common + "--save " + weights.string()).code, 0);
  const auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string saved = bytes(weights);
  const CliRun init = run(common + "--init " + weights.string() + " --report " + (dir / "." / "w.safetensors").string());
  EXPECT_EQ(init.code, 2) << init.output;
  EXPECT_NE(init.output.find("is --init (" + weights.string() + "), which the run reads"), std::string::npos)
      << init.output;
  EXPECT_EQ(bytes(weights), saved);

  const fs::path labels = dir / "train-labels-idx1-ubyte.gz";
  const fs::path link = dir / "link.json";
  fs::remove(link);  // from an earlier run
  fs::create_symlink(labels, link);
  const std::string before = bytes(labels);
  const CliRun data = run(common + "--trace " + link.string());
  EXPECT_EQ(data.code, 2) << data.output;
  EXPECT_NE(data.output.find("is a file of --data"), std::string::npos) << data.output;
  EXPECT_EQ(data.output.find("result"), std::string::npos) << "trained before failing:\n" << data.output;
  EXPECT_EQ(bytes(labels), before);
  // A dangling link to the plain file the loader would prefer over the .gz:
  // writing through it would have put a JSON file where the images are read.
  const fs::path plain = dir / "train-labels-idx1-ubyte";
  ASSERT_FALSE(fs::exists(plain));
  fs::remove(dir / "dangling.json");
  fs::create_symlink(plain, dir / "dangling.json");
  const CliRun shadow = run(common + "--report " + (dir / "dangling.json").string());
  EXPECT_EQ(shadow.code, 2) << shadow.output;
  EXPECT_NE(shadow.output.find("is a file of --data"), std::string::npos) << shadow.output;
  EXPECT_FALSE(fs::exists(plain));

  // Continuing from a file and saving over it is fine: --save writes after --init was read.
  EXPECT_EQ(run(common + "--init " + weights.string() + " --save " + weights.string()).code, 0);

  // The job secret named by $LOCKSTEP_SECRET_FILE is an input as much as --secret-file's.
  const fs::path secret = dir / "job.secret";
  std::ofstream(secret) << "s3cret";
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write);
  ::setenv("LOCKSTEP_SECRET_FILE", secret.c_str(), 1);
  const CliRun env_secret = run(common + "--save " + secret.string());
  ::unsetenv("LOCKSTEP_SECRET_FILE");
  EXPECT_EQ(env_secret.code, 2) << env_secret.output;
  EXPECT_NE(env_secret.output.find("is $LOCKSTEP_SECRET_FILE (" + secret.string() + "), which the run reads"),
            std::string::npos)
      << env_secret.output;
  EXPECT_EQ(bytes(secret), "s3cret");

  // plan: --svg onto the --profile it reads.
  const fs::path profile = dir / "profile.json";
  const std::string two_steps = "train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 2 ";
  ASSERT_EQ(run(two_steps + "--profile " + profile.string()).code, 0);  // a profile needs a step past the first
  const std::string measured = bytes(profile);
  const CliRun plan = run("plan --profile " + profile.string() + " --svg " + profile.string());
  EXPECT_EQ(plan.code, 2) << plan.output;
  EXPECT_NE(plan.output.find("--svg " + profile.string() + " is --profile"), std::string::npos) << plan.output;
  EXPECT_EQ(bytes(profile), measured);
}

// What a command prints must arrive: on a full disk (/dev/full) the summary,
// the table or --json was lost and the exit code said success, also through
// lockstep launch, which passes rank 0's output on.
TEST(Cli, OutputThatCannotBeWrittenIsAnError) {
  const auto to_full = [](const std::string& args) {
    return run_command("sh -c '" + std::string(LOCKSTEP_CLI) + " " + args + " >/dev/full'");
  };
  const CliRun plan = to_full("plan --json");
  EXPECT_EQ(plan.code, 1) << plan.output;
  EXPECT_NE(plan.output.find("could not write to standard output (No space left on device)"), std::string::npos)
      << plan.output;
  const fs::path dir = make_data_dir("cli_full");
  const CliRun launched =
      to_full("launch --nproc 2 -- train --data " + dir.string() + " --micro-batch 8 --steps 2 --quiet");
  EXPECT_EQ(launched.code, 1) << launched.output;
  EXPECT_NE(launched.output.find("could not be passed on to standard output (No space left on device)"),
            std::string::npos)
      << launched.output;
  EXPECT_EQ(run_command("sh -c '" + std::string(LOCKSTEP_CLI) + " plan >/dev/null'").code, 0);
}

// A FIFO given as --init, --resume or plan's --profile is refused at once: opening
// one without a writer blocked for good (as --data's files are refused).
TEST(Cli, AFifoGivenAsAFileIsRefusedNotWaitedOn) {
  const fs::path dir = make_data_dir("cli_fifo");
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CliRun init = run_bounded("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 --init " +
                                  fifo.string());
  EXPECT_EQ(init.code, 1) << init.output;
  EXPECT_NE(init.output.find("--init: " + fifo.string() + ": not a regular file"), std::string::npos) << init.output;
  const CliRun resume = run_bounded("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 " +
                                    "--resume " + fifo.string());
  EXPECT_EQ(resume.code, 1) << resume.output;
  EXPECT_NE(resume.output.find("--resume: " + fifo.string() + ": not a regular file"), std::string::npos)
      << resume.output;
  const CliRun plan = run_bounded("plan --profile " + fifo.string());
  EXPECT_EQ(plan.code, 1) << plan.output;
  EXPECT_NE(plan.output.find(fifo.string() + " is not a regular file"), std::string::npos) << plan.output;
}

// One bucket is ready only when backward ends: on a communication thread of
// its own (--overlap on) it still runs after backward, and the summary says so.
TEST(Cli, OneBucketOnTheCommunicationThreadIsNotCalledOverlapped) {
  const fs::path dir = make_data_dir("cli_one_bucket");
  const CliRun r = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 2 --overlap on "
                       "--bucket-mb 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("all-reduced on the communication thread, after backward"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("during backward"), std::string::npos) << r.output;
}

// A flag the chosen model or optimizer would ignore is an error, not a no-op;
// --timeline-step past the end is found before training, with --epochs too.
// Each flag the chosen mode would ignore is refused, naming it, before any
// work (the data here is too small for the default run, so training would
// fail differently).
TEST(Cli, FlagsTheModeIgnoresAreRefusedByName) {
  const fs::path dir = make_data_dir("cli_mode_flags");
  const std::string common = "train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--atom 8", "--atom sets --deterministic's unit of summation"},
      {"--deterministic --ragged pad", "so --ragged has no effect"},
      {"--deterministic --bucket-mb 4", "so --bucket-mb has no effect"},
      {"--deterministic --overlap on", "so --overlap has no effect"},
      {"--bucket-mb 0 --first-bucket-mb 5", "so --first-bucket-mb has no effect"},
      {"--check-every 0 --on-divergence repair", "--check-every 0 turns the check off"},
      {"--bn-stats sync", "--model mlp has none"},
      {"--init /nonexistent.st --shuffle off --seed 3", "with --init, --shuffle off and --model mlp (no dropout)"},
      {"--checkpoint-every 5", "--checkpoint-every says how often to write --checkpoint FILE"},
      {"--init /nonexistent.st --resume /nonexistent.st", "--resume and --init both set the starting weights"},
      {"--auto-resume", "--auto-resume goes on from the file --checkpoint writes; give --checkpoint FILE too."},
      {"--auto-resume --checkpoint c.st --resume c.st", "--resume names the checkpoint to go on from, and --auto-resume"},
      {"--rank 1", "--rank is for a group of processes"},
      {"--secret-file /nonexistent", "--secret-file is for a group of processes"},
      {"--backend mpi --rendezvous file:/nonexistent", "--rendezvous is for --backend gloo"},
      {"--save ''", "--save needs a file name."},
  };
  for (const auto& [flags, message] : cases) {
    const CliRun r = run(common + flags);
    EXPECT_EQ(r.code, 2) << flags << ":\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << ":\n" << r.output;
  }
  // Checked before any work, each naming what to change.
  const std::vector<std::pair<std::string, std::string>> early = {
      {"bench overlap --replicas 1 --data " + dir.string(), "needs at least 2 replicas"},
      {"demo ragged --data " + dir.string(), "takes one global batch of 256 training samples"},
      // One class: the full-batch gradient is zero, and the errors printed as NaN, "exact".
      {"demo ragged --data " + make_data_dir("cli_one_class", 256, 0, 4, 1).string(),
       "so there is no error to show; give --data a set with 2 or more classes"},
      {"bench train --data " + dir.string(), "global batches of up to 256 samples"},
      // One class (zero-filled label files): the loss was 0 and the test accuracy 1, "perfect".
      {"train --replicas 2 --micro-batch 8 --steps 1 --data " +
           make_data_dir("cli_one_class_train", 256, 0, 4, 1).string(),
       "labels hold one class (every label is 0), and a classifier needs 2 or more"},
      {"bench allreduce --sizes 4K --algorithm native", "give --backend gloo or mpi with it"},
      {"bench allreduce --sizes 0x10", "use decimal bytes"},  // strtod read it as 16 bytes
      {"train --data " + (dir / "train-labels-idx1-ubyte.gz").string(), "is a file; give the directory (--data DIR) that holds"},
      {"launch --nproc 2 train --steps 2", "goes after --"},
      {"train --replicas 1 --steps 1 --inject same-seed --data " + dir.string(), "needs 2 or more replicas"},
      // Before the rendezvous: a rank started alone waited its whole timeout.
      {"train --backend gloo --world-size 2 --rank 0 --replicas 3 --rendezvous-timeout 600 --rendezvous file:" +
           (dir / "rdv").string() + " --data " + dir.string(),
       "--replicas 3 does not match the world size 2"},
      {"train --backend gloo --world-size 2 --rendezvous file:" + (dir / "rdv").string() + " --data " + dir.string(),
       "no rank given; give each process its own rank (--rank R"},
      {"train --backend gloo --world-size 2 --rank 0 --rendezvous-timeout 600 --link-bandwidth 1Gbit --rendezvous "
       "file:" + (dir / "rdv").string() + " --data " + dir.string(),
       "a modelled link (--link-bandwidth/--link-latency) is for the threads backend"},
  };
  for (const auto& [args, message] : early) {
    const CliRun r = run(args);
    EXPECT_NE(r.code, 0) << args << ":\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << ":\n" << r.output;
  }
  // Under mpirun without --backend mpi, every process would train alone.
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  const CliRun alone = run("train --steps 1 --data " + dir.string());
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(alone.code, 2) << alone.output;
  EXPECT_NE(alone.output.find("started by mpirun, but without --backend mpi"), std::string::npos) << alone.output;
  const CliRun bench = run("bench allreduce --sizes 4K --algorithm native");
  EXPECT_EQ(bench.output.find("bytes"), std::string::npos) << "measured before refusing:\n" << bench.output;
  // More than the machine has: 1024 replicas x 3 copies x 16 M parameters is ~200 GB.
  const CliRun huge = run("train --data " + make_data_dir("cli_huge", 1024).string() +
                          " --replicas 1024 --micro-batch 1 --hidden 4000,4000 --steps 1");
  EXPECT_EQ(huge.code, 2) << huge.output;
  EXPECT_NE(huge.output.find("GB for 1024 replicas' weights, gradients and optimizer state"), std::string::npos)
      << huge.output;
  // The process that writes checkpoints keeps a copy of one (Note
  // [Checkpoints in the background]): the weights and SGD's momentum, once,
  // 8 bytes a parameter more with --checkpoint.
  {
    const std::string base = "train --data " + make_data_dir("cli_copy", 64).string() + " --micro-batch 1 --steps 1";
    const auto number_after = [](const std::string& text, const std::string& before) {
      const auto at = text.find(before);
      return at == std::string::npos ? -1.0 : std::stod(text.substr(at + before.size()));
    };
    // For `command` refused with 1 MB free, without and with --checkpoint:
    // the parameters, and how many MB more the second needs.
    const auto more_with_checkpoint = [&](const std::string& command) {
      ::setenv("LOCKSTEP_MEMORY_AVAILABLE", "1e6", 1);
      const CliRun plain = run(command);
      const CliRun copied =
          run(command + " --checkpoint " + (fs::path(LOCKSTEP_TEST_TMPDIR) / "cli_copy.st").string());
      ::unsetenv("LOCKSTEP_MEMORY_AVAILABLE");
      EXPECT_EQ(plain.code, 2) << plain.output;
      EXPECT_EQ(copied.code, 2) << copied.output;
      EXPECT_NE(copied.output.find("with a checkpoint's copy (--checkpoint)"), std::string::npos) << copied.output;
      return std::pair(number_after(plain.output, "optimizer state ("),
                       number_after(copied.output, "needs at least ") - number_after(plain.output, "needs at least "));
    };
    const auto [params, more] = more_with_checkpoint(base + " --replicas 1 --hidden 4000,4000");
    ASSERT_GT(params, 1.5e7);
    EXPECT_NEAR(more, params * 8 / 1e6, 2);
    // With --compress bf16 on 2 replicas, also each replica's rounding error,
    // copied and, while rank 0 gathers it, gathered: 4 x (2 + 2 x 2) bytes a parameter.
    const auto [params2, more2] = more_with_checkpoint(base + " --replicas 2 --hidden 2000,2000 --compress bf16");
    ASSERT_GT(params2, 3.9e6);
    EXPECT_NEAR(more2, params2 * 24 / 1e6, 2);
  }
  // Activations too: one replica's 7500 samples x 200794 floats through a
  // Linear of 100000 is ~6 GB, x 8 replicas ~48 GB; its weights ~1 GB each.
  // With 20 GB free, whatever this machine has (LOCKSTEP_MEMORY_AVAILABLE).
  ::setenv("LOCKSTEP_MEMORY_AVAILABLE", "2e10", 1);
  const CliRun wide = run("train --data " + make_data_dir("cli_wide", 60000).string() +
                          " --micro-batch 7500 --hidden 100000 --steps 1");
  ::unsetenv("LOCKSTEP_MEMORY_AVAILABLE");
  EXPECT_EQ(wide.code, 2) << wide.output;
  EXPECT_NE(wide.output.find("GB for 8 replicas' activations of 7500 samples each"), std::string::npos)
      << wide.output;
  // The CNN's activations count too (~350 KB a sample: 2 x 2000 samples is
  // ~1.4 GB, with 1 GB free); they were left out, and such a run was
  // accepted and ended by the kernel. And an all-reduce's buffers.
  ::setenv("LOCKSTEP_MEMORY_AVAILABLE", "1e9", 1);
  const CliRun cnn = run("train --model cnn --data " + make_data_dir("cli_cnn_wide", 4000, 0, 28).string() +
                         " --replicas 2 --micro-batch 2000 --steps 1");
  const CliRun sizes = run("bench allreduce --replicas 2 --sizes 4K,1G");
  ::unsetenv("LOCKSTEP_MEMORY_AVAILABLE");
  EXPECT_EQ(cnn.code, 2) << cnn.output;
  EXPECT_NE(cnn.output.find("GB for 2 replicas' activations of 2000 samples each"), std::string::npos) << cnn.output;
  EXPECT_EQ(cnn.output.find("--hidden"), std::string::npos) << "--model cnn takes no --hidden:\n" << cnn.output;
  EXPECT_EQ(sizes.code, 2) << sizes.output;
  EXPECT_NE(sizes.output.find("an all-reduce of 1073741824 bytes per rank on 2 ranks here needs"), std::string::npos)
      << sizes.output;
  EXPECT_EQ(sizes.output.find("time_us"), std::string::npos) << "measured before refusing:\n" << sizes.output;
  // Nothing free (a container at its memory limit) is a limit, not "unknown":
  // refused before anything loads or runs (until 2026-12-07, 0 skipped the checks).
  ::setenv("LOCKSTEP_MEMORY_AVAILABLE", "0", 1);
  const CliRun full = run("train --data " + make_data_dir("cli_full", 64).string() + " --replicas 2 --steps 1");
  const CliRun full_sizes = run("bench allreduce --replicas 2 --sizes 4K");
  ::unsetenv("LOCKSTEP_MEMORY_AVAILABLE");
  EXPECT_EQ(full.code, 2) << full.output;
  EXPECT_NE(full.output.find("0 MB left free for the data; give a smaller data set (--data DIR), or free memory"),
            std::string::npos)
      << full.output;
  EXPECT_EQ(full_sizes.code, 2) << full_sizes.output;
  EXPECT_NE(full_sizes.output.find("this host has 0 MB free"), std::string::npos) << full_sizes.output;
  const CliRun tree = run("bench allreduce --algorithm tree --replicas 5 --sizes 4K");
  EXPECT_EQ(tree.code, 2) << tree.output;
  EXPECT_NE(tree.output.find("power-of-two number of ranks, not 5"), std::string::npos) << tree.output;
  EXPECT_EQ(tree.output.find("time_us"), std::string::npos) << "printed before refusing:\n" << tree.output;
  const CliRun typo = run("launch --nproc 2 --bogus -- plan");  // a launch flag, not a misplaced command
  EXPECT_EQ(typo.output.find("goes after --"), std::string::npos) << typo.output;
}

// A fault named at a step before a resumed run's first never happens: the run
// says so instead of showing a clean run as if the guards had seen nothing.
// Without it, --resume with --inject bitflip@2:1 after step 4 ended with
// every check agreeing and no word of the flip.
TEST(Cli, AFaultBeforeTheResumedStepsIsNamedAsOneThatWillNotHappen) {
  const fs::path dir = make_data_dir("cli_inject_resume");
  const std::string ck = (dir / "run.ck").string();
  const std::string common = "train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 8 --quiet ";
  const CliRun first = run(common + "--checkpoint " + ck + " --checkpoint-every 4 --inject throw@6:1");
  EXPECT_EQ(first.code, 1) << first.output;
  const CliRun resumed = run(common + "--resume " + ck + " --inject bitflip@2:1 --inject bitflip@5:1");
  EXPECT_EQ(resumed.code, 1) << resumed.output;  // the flip after step 5 is caught at the last
  EXPECT_NE(resumed.output.find("--inject names step 2, before the steps this run goes on with (from 4, --resume): "
                                "that fault will not happen in this run."),
            std::string::npos)
      << resumed.output;
  EXPECT_EQ(resumed.output.find("--inject names step 5, before"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("replicas diverged by step 7"), std::string::npos) << resumed.output;
}

TEST(Cli, IgnoredFlagsAndAnUnreachableTimelineStepFailBeforeTraining) {
  const fs::path dir = make_data_dir("cli_ignored");
  const std::string common = "train --data " + dir.string() + " --replicas 2 --micro-batch 8 ";
  const CliRun hidden = run(common + "--steps 1 --model cnn --hidden 64");
  EXPECT_EQ(hidden.code, 2);
  EXPECT_NE(hidden.output.find("--hidden sets the widths of --model mlp"), std::string::npos) << hidden.output;
  const CliRun nesterov = run(common + "--steps 1 --optimizer adamw --nesterov");
  EXPECT_EQ(nesterov.code, 2);
  EXPECT_NE(nesterov.output.find("--nesterov applies to --optimizer sgd only"), std::string::npos)
      << nesterov.output;
  const CliRun momentum = run(common + "--steps 1 --optimizer adamw --momentum 0.5");
  EXPECT_EQ(momentum.code, 2);
  EXPECT_NE(momentum.output.find("--momentum applies to --optimizer sgd only"), std::string::npos)
      << momentum.output;
  const CliRun length = run(common + "--steps 3 --epochs 2");
  EXPECT_EQ(length.code, 2);
  EXPECT_NE(length.output.find("--steps and --epochs both set the length"), std::string::npos) << length.output;
  const CliRun bf16 = run(common + "--steps 1 --compress bf16 --algorithm halving_doubling");
  EXPECT_EQ(bf16.code, 2);
  EXPECT_NE(bf16.output.find("--compress bf16 all-reduces with its own ring"), std::string::npos) << bf16.output;
  const CliRun ring_bf16 = run(common + "--steps 1 --compress bf16 --algorithm ring --quiet");
  EXPECT_EQ(ring_bf16.code, 0) << ring_bf16.output;
  // The formula's P is the bf16 bytes, half the float32 gradients' named above it.
  EXPECT_NE(ring_bf16.output.find(" of gradients in bf16, independent of the micro-batch)"), std::string::npos)
      << ring_bf16.output;
  const CliRun late = run(common + "--steps 4 --inject nan@4:1");
  EXPECT_EQ(late.code, 2);
  EXPECT_NE(late.output.find("--inject names step 4, past the run's last step (3)"), std::string::npos)
      << late.output;
  // A failure may come after the last step (throw@<the run's steps>), not later.
  const CliRun later = run(common + "--steps 4 --inject throw@5:1");
  EXPECT_EQ(later.code, 2) << later.output;
  EXPECT_NE(later.output.find("--inject names step 5, past the run's last step (3)"), std::string::npos)
      << later.output;
  // 64 samples, global batch 16: 2 epochs are 8 steps.
  const std::string svg = " --timeline-svg " + (dir / "t.svg").string();
  const CliRun past = run(common + "--epochs 2" + svg + " --timeline-step 8");
  EXPECT_EQ(past.code, 2);
  EXPECT_NE(past.output.find("past the run's last step (7)"), std::string::npos) << past.output;
  EXPECT_EQ(past.output.find("result"), std::string::npos) << "trained before failing:\n" << past.output;
  // Global batch 24: an epoch is 3 steps when the last partial batch is kept, 2 when it is dropped.
  const std::string odd = "train --data " + dir.string() + " --replicas 2 --micro-batch 12 --epochs 2" + svg;
  const CliRun kept = run(odd + " --timeline-step 6");
  EXPECT_NE(kept.output.find("past the run's last step (5)"), std::string::npos) << kept.output;
  const CliRun dropped = run(odd + " --ragged drop --timeline-step 4");
  EXPECT_NE(dropped.output.find("past the run's last step (3)"), std::string::npos) << dropped.output;
  // A batch the data cannot fill is refused for that reason, not for the step.
  const CliRun big = run("train --data " + dir.string() + " --replicas 2 --micro-batch 64 --epochs 1" + svg +
                         " --timeline-step 0");
  EXPECT_EQ(big.code, 2);
  EXPECT_NE(big.output.find("is larger than the data set"), std::string::npos) << big.output;
  EXPECT_EQ(big.output.find("--timeline-step"), std::string::npos) << big.output;
}

// A directory no file can be made in, even by root (as CI runs): refused
// before training.
TEST(Cli, AnOutputInAnUnwritableDirectoryIsRefusedBeforeTraining) {
  const fs::path dir = make_data_dir("cli_unwritable");
  const CliRun r = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 --trace " +
                       "/proc/lockstep-trace.json");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--trace /proc/lockstep-trace.json: cannot write in the directory /proc ("),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("result"), std::string::npos) << "trained before failing:\n" << r.output;
  // A directory that is missing, and one that is a file, are named as such.
  const CliRun missing = run("train --data " + dir.string() + " --steps 1 --report " + (dir / "no/r.json").string());
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("the directory " + (dir / "no").string() + " does not exist."), std::string::npos)
      << missing.output;
  const fs::path file = dir / "train-labels-idx1-ubyte.gz";
  const CliRun under_file = run("train --data " + dir.string() + " --steps 1 --report " + (file / "r.json").string());
  EXPECT_EQ(under_file.code, 2) << under_file.output;
  EXPECT_NE(under_file.output.find(file.string() + " is a file, not a directory"), std::string::npos)
      << under_file.output;
}

// An output that is a symbolic link, a device or a FIFO is written through,
// not replaced: the link stays a link (its target gets the plot), /dev/null
// stays a device (a copy of it here, made with mknod, as root is), a FIFO
// with a reader gets the bytes and one with none is refused at once; and a
// file that existed keeps its mode.
TEST(Cli, OutputsWriteThroughLinksDevicesAndPipesAndKeepTheFileMode) {
  const fs::path dir = fs::path(LOCKSTEP_TEST_TMPDIR) / "cli_special_outputs";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string plan = "plan --params 1M --compute-ms 10 --replicas 2 --svg ";

  {  // a link, relative, to a file that exists
    std::ofstream(dir / "target.svg") << "old";
    fs::create_symlink("target.svg", dir / "link.svg");
    const CliRun r = run(plan + (dir / "link.svg").string());
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(fs::is_symlink(dir / "link.svg"));
    std::ifstream in(dir / "target.svg");
    EXPECT_NE(std::string(std::istreambuf_iterator<char>(in), {}).find("<svg"), std::string::npos);
  }
  {  // a file's mode survives the rename
    std::ofstream(dir / "private.svg") << "old";
    fs::permissions(dir / "private.svg", fs::perms::owner_read | fs::perms::owner_write);
    const CliRun r = run(plan + (dir / "private.svg").string());
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(fs::status(dir / "private.svg").permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
  }
  {  // /dev/stdout: here a pipe (popen), whose /proc link reads "pipe:[N]", no path
    const CliRun r = run(plan + "/dev/stdout");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("<svg"), std::string::npos) << r.output;
  }
  {  // the plot takes standard output, and the table goes to standard error
    const CliRun r = run_command("(" + std::string(LOCKSTEP_CLI) + " " + plan + "/dev/stdout 2>/dev/null)");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(r.output.rfind("<svg", 0), 0u) << r.output;
    EXPECT_TRUE(r.output.ends_with("</svg>\n")) << r.output;
  }
  {  // with --json the plot would run into the JSON: refused
    const CliRun r = run("plan --json --svg /dev/stdout");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("is standard output, where --json writes the plan"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("<svg"), std::string::npos) << r.output;
  }
  {  // /dev/stdout redirected to a file the user had: appended to, not renamed over
    const fs::path log = dir / "log.txt";
    std::ofstream(log) << "precious\n";
    const CliRun r = run(plan + "/dev/stdout >> " + log.string());
    EXPECT_EQ(r.code, 0) << r.output;
    std::ifstream in(log);
    const std::string text(std::istreambuf_iterator<char>(in), {});
    EXPECT_EQ(text.rfind("precious\n", 0), 0u) << text;
    EXPECT_NE(text.find("<svg"), std::string::npos) << text;
    EXPECT_NE(text.find("plot: /dev/stdout"), std::string::npos) << "plan's own output was lost:\n" << text;
  }
  {  // a socket: refused before anything is computed
    const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string where = (dir / "sock").string();
    ASSERT_LT(where.size(), sizeof addr.sun_path);
    std::memcpy(addr.sun_path, where.c_str(), where.size() + 1);
    ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
    const CliRun r = run(plan + where);
    ::close(s);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("is a socket"), std::string::npos) << r.output;
  }
  if (::geteuid() == 0) {  // a character device: a copy of /dev/null
    ASSERT_EQ(::mknod((dir / "null").c_str(), S_IFCHR | 0666, ::makedev(1, 3)), 0) << std::strerror(errno);
    const CliRun r = run(plan + (dir / "null").string());
    EXPECT_EQ(r.code, 0) << r.output;
    struct stat st {};
    ASSERT_EQ(::stat((dir / "null").c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device was replaced by a file";
  }
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0644), 0) << std::strerror(errno);
  {  // a FIFO with nobody reading: refused, not blocked on
    const CliRun r = run(plan + (dir / "pipe").string());
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("nothing is reading the pipe"), std::string::npos) << r.output;
  }
  {  // a FIFO with a reader gets the plot (it fits in the pipe's buffer: read after the run)
    const int reader = ::open((dir / "pipe").c_str(), O_RDONLY | O_NONBLOCK);
    ASSERT_GE(reader, 0) << std::strerror(errno);
    const CliRun r = run(plan + (dir / "pipe").string());
    std::string got;
    char buf[4096];
    for (ssize_t n; (n = ::read(reader, buf, sizeof buf)) > 0;) got.append(buf, std::size_t(n));
    ::close(reader);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(got.find("<svg"), std::string::npos);
    struct stat st {};
    ASSERT_EQ(::stat((dir / "pipe").c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
  }
}

TEST(Cli, ClassesWithoutATrainingExampleAreWarnedAbout) {
  const fs::path dir = make_data_dir("cli_stray_label", 64, 7);  // classes 0..7, 3 to 6 never seen
  const CliRun r = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("4 of the 8 classes (0 to the largest label) have no training example"),
            std::string::npos)
      << r.output;
  const CliRun clean = run("train --data " + make_data_dir("cli_no_stray").string() +
                           " --replicas 2 --micro-batch 8 --steps 1");
  EXPECT_EQ(clean.output.find("no training example"), std::string::npos) << clean.output;
}

TEST(Cli, PlanFlagsAreNamedInTheirErrors) {
  const CliRun intra = run("plan --per-node 2 --intra-bandwidth 0");
  EXPECT_EQ(intra.code, 2);
  EXPECT_NE(intra.output.find("--intra-bandwidth: bad link bandwidth '0'"), std::string::npos) << intra.output;
  // Without nodes of several replicas there is no intra-node link to set.
  const CliRun alone = run("plan --intra-bandwidth 10GB/s");
  EXPECT_EQ(alone.code, 2);
  EXPECT_NE(alone.output.find("--intra-bandwidth is the link between replicas of one node"), std::string::npos)
      << alone.output;
  const CliRun flops = run("plan --device-flops 0");
  EXPECT_EQ(flops.code, 2);
  EXPECT_NE(flops.output.find("such as 125T"), std::string::npos) << flops.output;
  const CliRun dir = run("plan --profile " + std::string(LOCKSTEP_TEST_TMPDIR));
  EXPECT_EQ(dir.code, 1);
  EXPECT_NE(dir.output.find("is a directory, not a profile"), std::string::npos) << dir.output;
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

// --save writes batch norm's running statistics with the weights (PyTorch's
// state_dict), and --init reads them back: a run that goes on from a file
// goes on from its statistics. Before, they were not saved, and under --init
// they started at 0 (not even variance 1): one more step left
// num_batches_tracked at 1, not 4.
TEST(Cli, SaveAndInitCarryTheBatchNormStatistics) {
  const auto dir = make_data_dir("cli_bn_state", 64, 0, 28);
  const std::string common = "train --data " + dir.string() + " --model cnn --replicas 2 --micro-batch 8 --quiet" + kStatedPeak;
  const fs::path a = dir / "a.safetensors", b = dir / "b.safetensors";
  ASSERT_EQ(run(common + "--steps 3 --save " + a.string()).code, 0);
  const CliRun more = run(common + "--steps 1 --init " + a.string() + " --save " + b.string());
  ASSERT_EQ(more.code, 0) << more.output;
  const auto tensor = [](const fs::path& file, const std::string& name) {
    for (const auto& t : lockstep::nn::load_safetensors(file).tensors)
      if (t.name == name) return t.data;
    ADD_FAILURE() << file << " has no " << name;
    return std::vector<float>{};
  };
  EXPECT_EQ(tensor(a, "1.num_batches_tracked"), std::vector<float>{3});
  EXPECT_EQ(tensor(b, "1.num_batches_tracked"), std::vector<float>{4});
  // One update of momentum 0.1 from a's statistics: b's variance stays near a's.
  const auto var_a = tensor(a, "1.running_var"), var_b = tensor(b, "1.running_var");
  ASSERT_EQ(var_a.size(), var_b.size());
  ASSERT_FALSE(var_a.empty());
  for (std::size_t i = 0; i < var_a.size(); ++i) EXPECT_GT(var_b[i], 0.8f * var_a[i]) << i;
}

// --bn-stats sync all-reduces the buffers every step in a collective of its
// own, beside the gradients'; the summary's buffers line said they were
// averaged but not what that sent, and the communicated line counts the
// gradients only.
TEST(Cli, SyncedBuffersSayWhatTheirAllReduceSends) {
  const auto dir = make_data_dir("cli_bn_sync", 64, 0, 28);
  const fs::path report = dir / "r.json";
  const CliRun r = run("train --data " + dir.string() + " --model cnn --replicas 2 --micro-batch 8 --steps 3 --quiet" +
                       kStatedPeak + "--bn-stats sync --report " + report.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(std::ifstream(report));
  const std::uint64_t buffers = j["bytes"]["per_replica_sent"][0]["buffers"];
  ASSERT_GT(buffers, 0u);
  EXPECT_NE(r.output.find("identical on every replica; " + std::to_string(buffers / 3) +
                          " B a step per replica in an all-reduce of their own"),
            std::string::npos)
      << r.output;
  // The CNN's dropout: its masks are the card's other non-parameter state,
  // per sample, never communicated. The MLP has none, and no such line.
  EXPECT_NE(r.output.find("  dropout      masks drawn per sample"), std::string::npos) << r.output;
  const CliRun mlp = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 --quiet" + kStatedPeak);
  ASSERT_EQ(mlp.code, 0) << mlp.output;
  EXPECT_EQ(mlp.output.find("dropout"), std::string::npos) << mlp.output;
}

// --zero 1 from the command line: the same weights file as without it, and
// the summary and the report say what was sharded and what was sent.
TEST(Cli, ZeroOneShardsTheStateAndSavesTheSameWeights) {
  const auto dir = make_data_dir("cli_zero", 256);
  const std::string common =
      "train --data " + dir.string() + " --replicas 4 --micro-batch 8 --hidden 16 --steps 6" + kStatedPeak;
  const fs::path a = dir / "a.st", b = dir / "b.st", report = dir / "b.json";
  ASSERT_EQ(run(common + "--quiet --save " + a.string()).code, 0);
  const CliRun sharded = run(common + "--zero 1 --save " + b.string() + " --report " + report.string());
  ASSERT_EQ(sharded.code, 0) << sharded.output;
  const auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(a), bytes(b)) << "--zero 1 trained other weights";
  EXPECT_NE(sharded.output.find("of gradients in one reduce-scatter, one bucket, then"), std::string::npos) << sharded.output;
  EXPECT_NE(sharded.output.find("of weights all-gathered after the optimizer step"), std::string::npos);
  EXPECT_NE(sharded.output.find("waiting for the last replica to join the reduce-scatter"), std::string::npos)
      << sharded.output;
  const auto j = nlohmann::json::parse(bytes(report));
  EXPECT_EQ(j["config"]["zero"], 1);
  const std::uint64_t whole = j["bytes"]["optimizer_state_unsharded"], mine = j["bytes"]["optimizer_state_per_replica"];
  EXPECT_LT(mine, whole / 4 + 64);
  EXPECT_GT(j["bytes"]["weights_all_gathered_per_step_per_replica"].get<std::uint64_t>(), 0u);
  // The bytes after the broadcast are the run's, all replicas together (the
  // report's weights_exchanged_after_init), not one step's of one replica
  // like the line above them; the summary said only "X after".
  EXPECT_GT(j["bytes"]["weights_exchanged_after_init"].get<std::uint64_t>(),
            j["bytes"]["weights_all_gathered_per_step_per_replica"].get<std::uint64_t>());
  EXPECT_NE(sharded.output.find(" after by all replicas over the run (all-gathered every step"), std::string::npos)
      << sharded.output;
  EXPECT_EQ(run(common + "--zero 1 --replicas 1").code, 2);
  EXPECT_EQ(run(common + "--zero 2").code, 2);
  // A profile of a sharded step would be sharded twice by lockstep plan --zero 1.
  const CliRun profile = run(common + "--zero 1 --profile " + (dir / "p.json").string());
  EXPECT_EQ(profile.code, 2);
  EXPECT_NE(profile.output.find("run --profile without --zero 1"), std::string::npos) << profile.output;
  EXPECT_FALSE(fs::exists(dir / "p.json"));
  // The flat ring reads no nodes.
  EXPECT_EQ(run(common + "--zero 1 --per-node 2 --link-bandwidth 1Gbit").code, 2);
  // A flip the next all-gather hides is refused; one in a checked step is caught.
  EXPECT_EQ(run(common + "--zero 1 --inject bitflip@2:1").code, 2);
  const CliRun caught = run(common + "--zero 1 --inject bitflip@5:1");  // the last step is always checked
  EXPECT_EQ(caught.code, 1);
  EXPECT_NE(caught.output.find("replicas diverged by step 5"), std::string::npos) << caught.output;
}

TEST(Cli, BadSafetensorsInitIsNamed) {
  const auto dir = make_data_dir("badinit");
  const fs::path bad = dir / "bad.safetensors";
  std::ofstream(bad) << "garbage";
  const CliRun r = run("train --data " + dir.string() + " --steps 1 --init " + bad.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("bad.safetensors"), std::string::npos) << r.output;
  // Well-formed weights holding a NaN (the file's last float, of its last tensor): refused, not
  // trained into NaN.
  const fs::path good = dir / "good.safetensors";
  const std::string common = "train --data " + dir.string() + " --replicas 2 --micro-batch 4 --hidden 8 --steps 1";
  ASSERT_EQ(run(common + " --quiet --save " + good.string()).code, 0);
  {
    std::fstream f(good, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-4, std::ios::end);
    const unsigned char nan[4] = {0x00, 0x00, 0xc0, 0x7f};  // a quiet NaN, little-endian
    f.write(reinterpret_cast<const char*>(nan), 4);
  }
  const CliRun poisoned = run(common + " --init " + good.string());
  EXPECT_EQ(poisoned.code, 2) << poisoned.output;
  EXPECT_NE(poisoned.output.find("holds NaN or infinite values"), std::string::npos) << poisoned.output;
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

// --peak-gflops: MFU against the figure given, which nothing measures; the
// summary says whose peak it is, and a run faster than it is warned about.
TEST(Cli, PeakGflopsIsThePeakMfuIsAgainst) {
  const auto dir = make_data_dir("cli_peak");
  const fs::path report = dir / "r.json";
  const std::string common = "train --data " + dir.string() + " --replicas 2 --micro-batch 4 --hidden 8 --steps 3 ";
  const CliRun r = run(common + "--peak-gflops 2.5 --report " + report.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(std::ifstream(report));
  EXPECT_FALSE(j["peak_flops_measured"].get<bool>());
  EXPECT_EQ(j["peak_flops"].get<double>(), 2.5e9);
  EXPECT_NEAR(j["mfu"].get<double>(), j["samples_per_s"].get<double>() * j["flops_per_sample"].get<double>() / 2.5e9,
              1e-9 * j["mfu"].get<double>());
  EXPECT_NE(r.output.find(" (of the peak --peak-gflops gives)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MFU over 1"), std::string::npos) << r.output;
  // A figure the run beats: warned about, not re-measured, and the run still succeeds.
  const CliRun fast = run(common + "--peak-gflops 1e-9 --report " + report.string());
  ASSERT_EQ(fast.code, 0) << fast.output;
  EXPECT_NE(fast.output.find("MFU over 1: training ran faster than the peak --peak-gflops gives (1e-09 GFLOP/s for the "
                             "job); check the figure"),
            std::string::npos)
      << fast.output;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(report))["peak_flops"].get<double>(), 1.0);
  for (const char* bad : {"-1", "abc", "2e9", "nan"}) {
    const CliRun b = run(common + "--peak-gflops " + bad);
    EXPECT_EQ(b.code, 2) << bad << ":\n" << b.output;
    EXPECT_NE(b.output.find("--peak-gflops"), std::string::npos) << bad << ":\n" << b.output;
  }
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
  EXPECT_EQ(j["epochs"], 1);  // completed: 64 samples are 4 steps of 16
  EXPECT_NE(r.output.find("6 steps (1.50 epochs)"), std::string::npos) << r.output;
  for (const char* k : {"final_loss", "test_accuracy", "samples_per_s", "mfu"})
    EXPECT_TRUE(j.contains(k)) << k;
  // MFU against the peak measured on all cores at start-up.
  EXPECT_TRUE(j["peak_flops_measured"].get<bool>());
  EXPECT_GT(j["peak_flops"].get<double>(), 1e9);
  EXPECT_NEAR(j["mfu"].get<double>(),
              j["samples_per_s"].get<double>() * j["flops_per_sample"].get<double>() / j["peak_flops"].get<double>(),
              1e-9 * j["mfu"].get<double>());
  const std::uint64_t p = (16 * 8 + 8 + 8 * 3 + 3) * 4;  // MLP 16-8-3 in bytes
  EXPECT_EQ(j["bytes"]["weights_per_replica"], p);
  EXPECT_EQ(j["bytes"]["grads_per_replica"], p);
  EXPECT_EQ(j["bytes"]["optimizer_state_per_replica"], p);
  EXPECT_EQ(j["bytes"]["allreduce_per_step_per_replica"], 2 * p * 3 / 4);
  EXPECT_EQ(j["bytes"]["weights_exchanged_after_init"], 0);
  EXPECT_EQ(j["bytes"]["activations_communicated"], 0);
  // In-process, the shared-memory all-reduce books bytes but sends no
  // message, and the summary says so rather than calling them messages.
  EXPECT_EQ(j["bytes"]["gradient_messages_per_step_per_replica"], 0.0);
  EXPECT_NE(r.output.find("of gradients in one all-reduce, one bucket"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("counted by the shared-memory all-reduce, which sends no messages"), std::string::npos)
      << r.output;
  // The divergence checks' share of the step time: the checks run (one,
  // after the last of 6 steps; --check-every is 20) over the steps' time.
  const std::size_t at = r.output.find(" ms each, ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const double share = std::stod(r.output.substr(at + 10));
  EXPECT_EQ(j["guards"]["divergence_checks"], 1);
  const double expected = 100.0 * j["timing"]["check_ms"].get<double>() / (6 * j["timing"]["step_ms"].get<double>());
  EXPECT_NEAR(share, expected, 0.051 + 0.001 * expected) << r.output;
  // --deterministic all-reduces the atoms' total in one call: no buckets.
  const fs::path det_report = dir / "deterministic.json";
  const CliRun det = run(common + " --steps 2 --deterministic --atom 2 --report " + det_report.string());
  ASSERT_EQ(det.code, 0) << det.output;
  EXPECT_NE(det.output.find("of gradients in one all-reduce ("), std::string::npos) << det.output;
  EXPECT_EQ(det.output.find("--algorithm ring"), std::string::npos) << "a flag --deterministic refuses";
  EXPECT_TRUE(nlohmann::json::parse(std::ifstream(det_report))["buckets"].empty());
  // The saved weights load back as --init. One replica has nothing to split
  // or communicate, and the summary says so (it said "cut into 1 disjoint
  // shards", "0 B of gradients in 2 all-reduces", "each other replica
  // received 0 B").
  const CliRun one = run("train --data " + dir.string() + " --replicas 1 --micro-batch 4 --hidden 8 --steps 1 --init " +
                         weights.string());
  EXPECT_EQ(one.code, 0) << one.output;
  EXPECT_NE(one.output.find("samples all go to the one replica"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("communicated nothing: one replica has no other to all-reduce with"), std::string::npos)
      << one.output;
  EXPECT_NE(one.output.find("weights: one replica, no other to broadcast them to"), std::string::npos) << one.output;
  EXPECT_EQ(one.output.find("each other replica"), std::string::npos) << one.output;
  // Nor anything to agree with or compare against: the guards line said
  // "weights verified after the broadcast" below "no other to broadcast them
  // to", and "compared every 20 steps" with no other replica's weights.
  EXPECT_EQ(one.output.find("after the broadcast;"), std::string::npos) << one.output;
  EXPECT_EQ(one.output.find("compared every"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("guards       one replica: no other to agree with"), std::string::npos) << one.output;
  // And a model of another shape refuses them, naming a tensor.
  const CliRun other =
      run("train --data " + dir.string() + " --hidden 9 --steps 1 --init " + weights.string());
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.output.find("0.weight"), std::string::npos) << other.output;
}

}  // namespace

namespace {

// The timeline flags end to end: a trace that parses with the expected
// events, and an SVG of the chosen step; on a modelled link, with buckets.
TEST(Cli, TraceAndTimelineAreWritten) {
  const fs::path dir = make_data_dir("cli_trace");
  const fs::path trace = dir / "run.json", svg = dir / "step.svg";
  const CliRun r =
      run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --hidden 16,16 --steps 3 " +
          "--link-bandwidth 1Gbit --link-latency 20us --first-bucket-mb 0.0001 --bucket-mb 0.001 " +
          "--trace " + trace.string() + " --timeline-svg " + svg.string() + " --timeline-step 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("all-reduced during backward, modelled link 1 Gbit/s, 20 us"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("all-reduces, one per bucket"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("counted message by message"), std::string::npos) << r.output;
  std::ifstream in(trace);
  const auto j = nlohmann::json::parse(in);
  std::size_t allreduce = 0, backward = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string cat = e["cat"];
    allreduce += cat == "allreduce";
    backward += cat == "backward";
  }
  EXPECT_EQ(backward, 2u * 3u * 5u);   // replicas x steps x layers
  EXPECT_GE(allreduce, 2u * 3u * 2u);  // at least two buckets per step
  std::ifstream s(svg);
  const std::string text((std::istreambuf_iterator<char>(s)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  EXPECT_NE(text.find("step 1"), std::string::npos);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
}

// In-process replicas know their nodes only from --per-node; the
// hierarchical all-reduce needs them, and without them the command is refused
// before it prints anything (it used to print the table's header first).
TEST(Cli, PerNodeGroupsInProcessReplicasForTheHierarchicalAllreduce) {
  const CliRun none = run("bench allreduce --sizes 4K --algorithm hierarchical --repeats 3");
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("give --per-node G"), std::string::npos) << none.output;
  EXPECT_EQ(none.output.find("time_us"), std::string::npos) << "refused before the table's header";
  const CliRun nodes = run("bench allreduce --sizes 4K --algorithm hierarchical --per-node 4 --repeats 3 --json");
  ASSERT_EQ(nodes.code, 0) << nodes.output;
  const auto rows = nlohmann::json::parse(nodes.output.substr(nodes.output.find('[')));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["algorithm"], "hierarchical");
  EXPECT_EQ(rows[0]["algorithm_run"], "hierarchical");
  EXPECT_EQ(rows[0]["replicas"], 8);
  // Asked for auto, each row names the algorithm that ran.
  const CliRun chosen = run("bench allreduce --sizes 4K --repeats 3 --json");
  ASSERT_EQ(chosen.code, 0) << chosen.output;
  const auto auto_rows = nlohmann::json::parse(chosen.output.substr(chosen.output.find('[')));
  EXPECT_EQ(auto_rows[0]["algorithm"], "auto");
  EXPECT_EQ(auto_rows[0]["algorithm_run"], "shared_memory");
  const CliRun uneven = run("bench allreduce --sizes 4K --per-node 3");
  EXPECT_EQ(uneven.code, 2);
  EXPECT_NE(uneven.output.find("does not divide the 8 replicas"), std::string::npos) << uneven.output;
  const CliRun gloo = run("bench allreduce --sizes 4K --per-node 2 --backend gloo");
  EXPECT_EQ(gloo.code, 2);
  EXPECT_NE(gloo.output.find("host names"), std::string::npos) << gloo.output;

  const fs::path dir = make_data_dir("cli_per_node");
  const std::string train = "train --data " + dir.string() + " --replicas 4 --micro-batch 4 --hidden 8 --steps 2 "
                            "--quiet --algorithm hierarchical";
  EXPECT_EQ(run(train).code, 2);
  const CliRun trained = run(train + " --per-node 2");
  EXPECT_EQ(trained.code, 0) << trained.output;
  // Where nothing reads it, refused by name: in-process without a link, auto
  // is the shared-memory path; ring never groups. Over a modelled link auto
  // takes the nodes.
  const std::string plain = "train --data " + dir.string() + " --replicas 4 --micro-batch 4 --hidden 8 --steps 2 "
                            "--quiet --per-node 2";
  for (const std::string& extra : {std::string(""), std::string(" --algorithm ring --link-latency 10us")}) {
    const CliRun ignored = run(plain + extra);
    EXPECT_EQ(ignored.code, 2) << extra << ":\n" << ignored.output;
    EXPECT_NE(ignored.output.find("--per-node is read only by the hierarchical all-reduce"), std::string::npos)
        << ignored.output;
  }
  EXPECT_EQ(run(plain + " --link-latency 10us").code, 0);
}

TEST(Cli, NewFlagsRejectBadValuesWithAMessage) {
  const fs::path dir = make_data_dir("cli_flags");
  const std::string common = "train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 ";
  const CliRun bw = run(common + "--link-bandwidth 10");
  EXPECT_EQ(bw.code, 2);
  EXPECT_NE(bw.output.find("10Gbit"), std::string::npos) << bw.output;
  EXPECT_EQ(run(common + "--link-latency fast").code, 2);
  // Empty values read as the flag not given (no link, the default data): refused.
  for (const char* flag : {"--link-latency", "--link-bandwidth", "--data"}) {
    const CliRun empty = run(std::string(flag) == "--data" ? "train --steps 1 --data ''" : common + flag + " ''");
    EXPECT_EQ(empty.code, 2) << flag;
    EXPECT_NE(empty.output.find(std::string(flag) + " needs a value"), std::string::npos) << empty.output;
  }
  const CliRun alone = run("train --data " + dir.string() + " --replicas 1 --micro-batch 8 --steps 1 --compress bf16");
  EXPECT_EQ(alone.code, 2) << alone.output;
  EXPECT_NE(alone.output.find("--compress bf16 with one replica sends nothing"), std::string::npos) << alone.output;
  EXPECT_EQ(run(common + "--ragged mean").code, 2);
  EXPECT_EQ(run(common + "--accumulate 0").code, 2);
  EXPECT_EQ(run(common + "--compress fp8").code, 2);
  EXPECT_EQ(run(common + "--timeline-step 3").code, 2);
  const CliRun past = run(common + "--timeline-svg " + (dir / "x.svg").string() + " --timeline-step 5");
  EXPECT_EQ(past.code, 2);
  EXPECT_NE(past.output.find("past the run's last step"), std::string::npos) << past.output;
  EXPECT_EQ(run(common + "--trace /nonexistent/dir/t.json").code, 2);
}

// --clip-grad-norm and --lr-warmup from the command line: the progress
// line's gradient norm, the summary's clipping line, the report's per-step
// norms, and values the run could not use refused by name.
TEST(Cli, ClippingAndWarmupShowInProgressSummaryAndReport) {
  const fs::path dir = make_data_dir("cli_clip");
  const fs::path report = dir / "clip.json";
  const std::string common = "train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 10" + kStatedPeak;
  const CliRun r = run(common + "--log-every 1 --clip-grad-norm 0.001 --lr-warmup 4 --report " + report.string());
  ASSERT_EQ(r.code, 0) << r.output;
  // lr 0.1 x 1/4 and 3/4 in the warmup (steps 1 and 3); 0.1 at steps 4 and 5,
  // the warmup's last and the cosine's first; at step 8, the cosine's 3 of its 6.
  const auto line_of = [&](const std::string& step) {
    const auto at = r.output.find("step " + step + "/10  loss");
    return at == std::string::npos ? std::string() : r.output.substr(at, r.output.find('\n', at) - at);
  };
  for (const auto& [step, lr] : std::vector<std::pair<std::string, std::string>>{
           {"1", "lr 0.025  "}, {"3", "lr 0.075  "}, {"4", "lr 0.1  "}, {"5", "lr 0.1  "}, {"8", "lr 0.05  "}}) {
    EXPECT_NE(line_of(step).find(lr), std::string::npos) << "step " << step << ": " << lr << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("grad norm max "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(clipped 1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("clipping     the averaged gradient's norm clipped to 0.001 at 10 of 10 steps applied"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("every replica computes it alike, with no communication"), std::string::npos)
      << r.output;
  const auto j = nlohmann::json::parse(std::ifstream(report));
  EXPECT_EQ(j["config"]["lr_warmup"], 4);
  EXPECT_EQ(j["clipping"]["clipped_steps"], 10);
  EXPECT_EQ(j["clipping"]["grad_norms"].size(), 10u);
  EXPECT_EQ(j["bytes"]["per_replica_sent"][1]["clip"], 0);
  // Under --zero 1 the replicas exchange their parts of the norm: 4N floats,
  // 32(N-1) bytes a replica a step in process. The summary gave the run's
  // total alone ("320 B per replica"), which read as a step's.
  const CliRun sharded = run(common + "--quiet --zero 1 --clip-grad-norm 0.001");
  ASSERT_EQ(sharded.code, 0) << sharded.output;
  EXPECT_NE(sharded.output.find("from the parts the replicas exchange (--zero 1: 32 B a step per replica, 320 B over "
                                "the run)"),
            std::string::npos)
      << sharded.output;
  const CliRun plain = run(common + "--quiet --report " + report.string());
  ASSERT_EQ(plain.code, 0) << plain.output;
  EXPECT_EQ(plain.output.find("clipping"), std::string::npos) << plain.output;
  EXPECT_TRUE(nlohmann::json::parse(std::ifstream(report))["clipping"].is_null());

  const CliRun negative = run(common + "--clip-grad-norm -1");
  EXPECT_EQ(negative.code, 2) << negative.output;
  EXPECT_NE(negative.output.find("--clip-grad-norm"), std::string::npos) << negative.output;
  const CliRun tiny = run(common + "--clip-grad-norm 1e-50");  // float32 would hold 0: no clipping
  EXPECT_EQ(tiny.code, 2) << tiny.output;
  EXPECT_NE(tiny.output.find("expected 0 (off) or a number float32 holds"), std::string::npos) << tiny.output;
  const CliRun long_warmup = run(common + "--lr-warmup 11");
  EXPECT_EQ(long_warmup.code, 2) << long_warmup.output;
  EXPECT_NE(long_warmup.output.find("--lr-warmup 11 is longer than the run (10 steps)"), std::string::npos)
      << long_warmup.output;
}

// Note [One bucket on shared cores]: with as many replicas as the host has
// cores, every gradient goes in one bucket, and the summary says why; a
// bucket flag, --overlap on or a modelled link keeps the buckets.
TEST(Cli, ReplicasSharingTheCoresTakeOneBucket) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 64) GTEST_SKIP() << "the data set has 64 samples: at most 64 replicas of 1";
  const fs::path dir = make_data_dir("cli_one_bucket");
  const fs::path report = dir / "one_bucket.json";
  const std::string common = "train --data " + dir.string() + " --replicas " + std::to_string(std::max(2L, cores)) +
                             " --micro-batch 1 --steps 2 --quiet --report " + report.string() + kStatedPeak;
  struct Case {
    std::string flags;
    bool one_bucket;
  };
  for (const auto& k : {Case{"", true}, Case{"--bucket-mb 25", false}, Case{"--first-bucket-mb 1", false},
                        Case{"--overlap on", false}, Case{"--link-latency 1us", false}}) {
    const CliRun r = run(common + k.flags);
    ASSERT_EQ(r.code, 0) << k.flags << "\n" << r.output;
    const auto j = nlohmann::json::parse(std::ifstream(report));
    EXPECT_EQ(j["config"]["one_bucket_on_shared_cores"], k.one_bucket) << k.flags;
    // The default MLP on 16 features: 1.09 MB of gradients, two buckets (1 MiB first) unless one.
    EXPECT_EQ(j["buckets"].size(), k.one_bucket ? 1u : 2u) << k.flags;
    EXPECT_EQ(r.output.find("every gradient in one: the replicas share the cores") != std::string::npos, k.one_bucket)
        << k.flags << "\n" << r.output;
  }
  // More replicas than cores: the communication times hold the other
  // replicas' compute, and the summary says so (a learner read the default
  // run as communication-bound).
  if (cores < 64) {
    const std::string more = std::to_string(cores + 1);
    const CliRun r = run("train --data " + dir.string() + " --replicas " + more + " --micro-batch 1 --steps 2" +
                         kStatedPeak);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("; " + more + " replicas share "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("so both hold the time the OS ran the other replicas' compute"), std::string::npos)
        << r.output;
  }
}

TEST(Cli, AccumulateIsInTheSummary) {
  const fs::path dir = make_data_dir("cli_accumulate");
  const CliRun r =
      run("train --data " + dir.string() + " --replicas 2 --micro-batch 4 --accumulate 3 --steps 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 replicas x 4 x 3 accumulated micro-steps = effective batch 24"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("communicated per step per replica: "), std::string::npos) << r.output;
  // The naive all-reduce does not send alike: rank 0 sends (N-1) P, the
  // others P. The summary gives both instead of calling rank 0's everyone's.
  const CliRun naive = run("train --data " + dir.string() + " --replicas 3 --micro-batch 4 --steps 2 --algorithm naive");
  ASSERT_EQ(naive.code, 0) << naive.output;
  EXPECT_NE(naive.output.find("communicated per step: rank 0 "), std::string::npos) << naive.output;
  EXPECT_NE(naive.output.find(" of gradients, the replicas "), std::string::npos) << naive.output;
}

TEST(Cli, DemoRaggedShowsWeightedIsExactAndPlainIsNot) {
  const fs::path data = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(data)) GTEST_SKIP() << "Fashion-MNIST is not installed";
  const CliRun r = run("demo ragged");
  ASSERT_EQ(r.code, 0) << r.output;
  auto error_of = [&](const std::string& label) {
    const auto pos = r.output.find("  " + label);
    EXPECT_NE(pos, std::string::npos) << r.output;
    const auto line = r.output.substr(pos, r.output.find('\n', pos) - pos);
    const auto e = line.find("e-");
    return std::stod(line.substr(line.rfind(' ', e) + 1));
  };
  // Eight equal shards of 32: the plain average of means is the gradient over all 256.
  EXPECT_LT(error_of("equal"), 1e-5);
  EXPECT_GT(error_of("plain"), 1e-2);
  // Against the true mean over 235 samples: 235/88 of its share for each of
  // the 11 (it said 32/11, their weight relative to the other samples).
  EXPECT_NE(r.output.find("each of the 11 samples weighs 235/88 = 2.67x its share, each other sample 235/256 = 0.92x"),
            std::string::npos)
      << r.output;
  EXPECT_LT(error_of("weighted"), 1e-5);
  EXPECT_LT(error_of("pad"), 1e-5);
}

TEST(Cli, TrainProfileFeedsPlan) {
  const fs::path dir = make_data_dir("cli_profile");
  const fs::path profile = dir / "profile.json";
  const CliRun r =
      run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --hidden 16,16 --steps 4 " +
          "--profile " + profile.string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(profile);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["format"], "lockstep-profile");
  ASSERT_EQ(j["layers"].size(), 5u);                               // Linear ReLU Linear ReLU Linear
  EXPECT_EQ(j["layers"][0]["param_bytes"], (16.0 * 16 + 16) * 4);  // 4x4 images -> 16
  EXPECT_EQ(j["layers"][1]["param_bytes"], 0.0);
  const CliRun plan = run("plan --profile " + profile.string());
  EXPECT_EQ(plan.code, 0) << plan.output;
  EXPECT_NE(plan.output.find("Recommendation"), std::string::npos) << plan.output;
  // Planned at the profile's own micro-batch unless told otherwise.
  EXPECT_NE(plan.output.find("at micro-batch 8"), std::string::npos) << plan.output;
  const CliRun told = run("plan --micro-batch 64 --profile " + profile.string());
  EXPECT_NE(told.output.find("at micro-batch 64"), std::string::npos) << told.output;
  // The activations the profile records are the MLP's, as plan counts them
  // for --model (they were 0): the input, 4 x 16 and 3 floats a sample.
  EXPECT_EQ(j["activation_bytes_per_sample"], (16.0 * 5 + 3) * 4);

  // With --accumulate K a step computes K micro-batches and steps the
  // optimizer once; the profile keeps one micro-batch's step (it recorded
  // all K, and plan priced them as one micro-batch).
  const fs::path accumulated = dir / "accumulated.json", report = dir / "report.json";
  ASSERT_EQ(run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --hidden 16,16 --steps 4 " +
                "--accumulate 4 --profile " + accumulated.string() + " --report " + report.string())
                .code,
            0);
  const auto a = nlohmann::json::parse(std::ifstream(accumulated));
  const auto rep = nlohmann::json::parse(std::ifstream(report));
  EXPECT_EQ(a["micro_batch"], 8);
  EXPECT_LT(a["step_compute_ms"].get<double>(), rep["timing"]["compute_ms"].get<double>());
  // A profile needs a step past the first, which warms up.
  const CliRun one = run("train --data " + dir.string() + " --replicas 2 --micro-batch 8 --steps 1 --profile " +
                         (dir / "one.json").string());
  EXPECT_EQ(one.code, 2) << one.output;
  EXPECT_NE(one.output.find("give --steps 2 or more"), std::string::npos) << one.output;
}

// bench train's rows and fields; the numbers themselves are timings, so only
// their relations that hold by construction are checked.
TEST(Cli, BenchTrainReportsEveryConfigurationAndItsMatmulBound) {
  const fs::path data = make_data_dir("bench_train", 512);
  const CliRun r = run("bench train --data " + data.string() + " --steps 2 --warmup 0 --repeats 1 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rows = nlohmann::json::parse(r.output.substr(r.output.find('[')));
  ASSERT_EQ(rows.size(), 4u) << r.output;
  const std::vector<std::pair<int, int>> configs = {{8, 32}, {2, 32}, {2, 128}, {1, 256}};
  double best = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    EXPECT_EQ(row["replicas"].get<int>(), configs[i].first);
    EXPECT_EQ(row["micro_batch"].get<int>(), configs[i].second);
    EXPECT_GT(row["samples_per_s"].get<double>(), 0);
    EXPECT_GT(row["matmul_samples_per_s"].get<double>(), 0);
    EXPECT_EQ(row["matmul_samples_per_s_runs"].size(), 1u);
    EXPECT_EQ(row["matmul_below_step"].get<bool>(),
              row["matmul_samples_per_s"].get<double>() < row["samples_per_s"].get<double>());
    const double bound = row["bound_on_fraction_of_best"].get<double>();
    EXPECT_GT(bound, 0);
    EXPECT_LE(bound, 1);
    EXPECT_DOUBLE_EQ(bound, std::min(1.0, row["matmul_samples_per_s"].get<double>() /
                                              (row["samples_per_s"].get<double>() / row["fraction_of_best"].get<double>())));
    best = std::max(best, row["fraction_of_best"].get<double>());
  }
  EXPECT_DOUBLE_EQ(best, 1.0);
}

// bench train printed MFU over 1 without a word (1.110 for 1 x 256 in a busy
// hour, against a peak measured low before the runs), where lockstep train
// measures again and warns. --peak-gflops states the peak, so the case is
// made on purpose: a figure far too low is named, a generous one is not.
TEST(Cli, BenchTrainSaysWhenMfuIsOverOne) {
  const fs::path data = make_data_dir("bench_train_peak", 512);
  const std::string common = "bench train --data " + data.string() + " --steps 2 --warmup 0 --repeats 1 ";
  const CliRun low = run(common + "--peak-gflops 1e-9");
  ASSERT_EQ(low.code, 0) << low.output;
  EXPECT_NE(low.output.find("peak: 1e-09 GFLOP/s (--peak-gflops)"), std::string::npos) << low.output;
  EXPECT_NE(low.output.find("note: MFU over 1: the runs were faster than the peak --peak-gflops gives"),
            std::string::npos)
      << low.output;
  const CliRun high = run(common + "--peak-gflops 1e6");
  ASSERT_EQ(high.code, 0) << high.output;
  EXPECT_EQ(high.output.find("MFU over 1"), std::string::npos) << high.output;
  const CliRun json = run(common + "--peak-gflops 1e6 --json");
  ASSERT_EQ(json.code, 0) << json.output;
  const auto rows = nlohmann::json::parse(json.output.substr(json.output.find('[')));
  for (const auto& row : rows) {
    EXPECT_DOUBLE_EQ(row["peak_sgemm_gflops"].get<double>(), 1e6);
    EXPECT_FALSE(row["peak_measured"].get<bool>());
  }
}

// --sizes are whole bytes: "4.5" was timed as 4 bytes and "1e-9" as 0, and
// each row printed as if it were the size asked for.
TEST(Cli, BenchAllreduceRefusesSizesThatAreNotWholeBytes) {
  for (const std::string size : {"4.5", "1e-9", "1.0001K"}) {
    const CliRun r = run("bench allreduce --replicas 2 --repeats 1 --sizes 4K," + size);
    EXPECT_EQ(r.code, 2) << size << ":\n" << r.output;
    EXPECT_NE(r.output.find("--sizes: " + size + " is not a whole number of bytes; give whole bytes"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("time_us"), std::string::npos) << "measured before refusing:\n" << r.output;
  }
  const CliRun odd = run("bench allreduce --replicas 2 --repeats 1 --sizes 6");
  EXPECT_EQ(odd.code, 2) << odd.output;
  EXPECT_NE(odd.output.find("6 is not a whole number of floats; give a multiple of 4 bytes"), std::string::npos)
      << odd.output;
  // A fraction of a unit that is whole bytes is one.
  const CliRun whole = run("bench allreduce --replicas 2 --repeats 1 --sizes 1.5K --json");
  ASSERT_EQ(whole.code, 0) << whole.output;
  EXPECT_EQ(nlohmann::json::parse(whole.output)[0]["bytes"], 1536) << whole.output;
}

// An all-reduce over one replica returns at once: its row had a busbw of 0
// and a memory-traffic ratio above 1, "faster than memcpy", for no work.
// (A process group of one: LaunchTrain.BenchAllreduceOfOneRankIsRefused.)
TEST(Cli, BenchAllreduceRefusesOneReplica) {
  const CliRun r = run("bench allreduce --replicas 1 --repeats 1 --sizes 4K --json");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("bench allreduce needs 2 or more replicas: an all-reduce over one rank returns at once"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("give --replicas 2 or more"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("time_us"), std::string::npos) << "measured before refusing:\n" << r.output;
}

// bench overlap's headline ratios set the bucketed arms against one bucket.
// With --bucket-mb 0 the bucketed arms were one bucket too: the same run
// compared with itself, printed as a result. And where the model's gradients
// fit in the first bucket, the table says that the two arms ran alike.
TEST(Cli, BenchOverlapDoesNotCompareOneBucketWithItselfSilently) {
  const fs::path data = make_data_dir("bench_overlap_buckets", 512);
  const std::string common =
      "bench overlap --data " + data.string() + " --hidden 8 --replicas 2 --steps 2 --repeats 1";
  const CliRun zero = run(common + " --bucket-mb 0");
  EXPECT_EQ(zero.code, 2) << zero.output;
  EXPECT_NE(zero.output.find("--bucket-mb 0 makes the bucketed arms one bucket after backward, the same as "
                             "the arm they are compared with; give a bucket size above 0"),
            std::string::npos)
      << zero.output;
  EXPECT_EQ(zero.output.find("step ms"), std::string::npos) << "ran before refusing:\n" << zero.output;
  // Under a byte, which the reducer read as 0: the same, in lockstep train too.
  const CliRun tiny = run(common + " --bucket-mb 1e-7");
  EXPECT_EQ(tiny.code, 2) << tiny.output;
  EXPECT_NE(tiny.output.find("--bucket-mb 1e-07 is under one byte, which would read as 0, one bucket after "
                             "backward"),
            std::string::npos)
      << tiny.output;
  EXPECT_EQ(tiny.output.find("step ms"), std::string::npos) << "ran before refusing:\n" << tiny.output;
  const CliRun small = run(common);
  ASSERT_EQ(small.code, 0) << small.output;
  EXPECT_NE(small.output.find("note: the default buckets are one bucket for this model"), std::string::npos)
      << small.output;
}

// The benchmarks that train check memory as lockstep train does, before
// anything runs: bench overlap's --hidden, or bench train's eight replicas of
// a first layer of features x 512, ran until the kernel's OOM killer ended them.
TEST(Cli, BenchOverlapAndTrainRefuseRunsThatDoNotFitInMemory) {
  ::setenv("LOCKSTEP_MEMORY_AVAILABLE", "3e8", 1);
  // 16 features: 16 M parameters x 2 replicas x 3 copies is ~390 MB.
  const CliRun overlap = run("bench overlap --data " + make_data_dir("bench_overlap_memory", 512).string() +
                             " --hidden 4000,4000 --replicas 2 --steps 2 --repeats 1 --micro-batch 8");
  // 100 x 100 images: 5.4 M parameters x 8 replicas x 3 copies is ~520 MB.
  const CliRun bench = run("bench train --data " + make_data_dir("bench_train_memory", 512, 0, 100).string() +
                           " --steps 2 --warmup 0 --repeats 1");
  ::unsetenv("LOCKSTEP_MEMORY_AVAILABLE");
  EXPECT_EQ(overlap.code, 2) << overlap.output;
  EXPECT_NE(overlap.output.find("for 2 replicas' weights, gradients and optimizer state"), std::string::npos)
      << overlap.output;
  EXPECT_NE(overlap.output.find("and it has 300 MB free"), std::string::npos) << overlap.output;
  EXPECT_EQ(overlap.output.find("step ms"), std::string::npos) << "ran before refusing:\n" << overlap.output;
  EXPECT_EQ(bench.code, 2) << bench.output;
  EXPECT_NE(bench.output.find("for 8 replicas' weights, gradients and optimizer state"), std::string::npos)
      << bench.output;
  EXPECT_EQ(bench.output.find("peak sgemm"), std::string::npos) << "ran before refusing:\n" << bench.output;
}

// --repeats runs the bucket comparison's two arms; the micro-batch sweep,
// which is there for its bytes per step, runs once. The help, the table and
// the JSON said or implied "the median of --repeats runs" for every arm.
TEST(Cli, BenchOverlapSaysHowManyRunsEachArmHad) {
  const fs::path data = make_data_dir("bench_overlap_runs", 512);
  const CliRun r = run("bench overlap --data " + data.string() +
                       " --hidden 8 --replicas 2 --steps 2 --repeats 2 --micro-batch 16 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto arms = nlohmann::json::parse(r.output)[0]["arms"];
  ASSERT_EQ(arms.size(), 4u) << r.output;
  EXPECT_EQ(arms[0].value("runs", -1), 2) << arms[0];
  EXPECT_EQ(arms[1].value("runs", -1), 2) << arms[1];
  EXPECT_EQ(arms[2].value("runs", -1), 1) << arms[2];
  EXPECT_EQ(arms[3].value("runs", -1), 1) << arms[3];
  const CliRun table = run("bench overlap --data " + data.string() + " --hidden 8 --replicas 2 --steps 2");
  ASSERT_EQ(table.code, 0) << table.output;
  EXPECT_NE(table.output.find("x 3 runs (the micro-batch sweep: 1 run)"), std::string::npos) << table.output;
  const CliRun help = run("bench overlap --help");
  EXPECT_NE(help.output.find("(the micro-batch sweep runs once)"), std::string::npos) << help.output;
}

// --timeout holds for in-process replicas as for a process group (it was
// left at the default 60 s), and the error is the timeout itself, exit 1, not
// rank 0's "communicator aborted" (exit 3, another rank of a process group
// failed). A 1 ms limit cannot be met here: in a 16 MiB naive all-reduce over
// 8 replicas, rank 0 sums 112 MiB before any other rank hears back.
TEST(Cli, BenchAllreduceHoldsInProcessReplicasToTimeout) {
  const CliRun r = run("bench allreduce --sizes 16M --replicas 8 --repeats 1 --algorithm naive --timeout 0.001");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("timed out after 1 ms"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("If what it waited for was slow rather than stopped or gone, raise --timeout (seconds)."),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("communicator aborted"), std::string::npos) << r.output;
}

TEST(Cli, PlanWithDefaultsPrintsATableAndARecommendation) {
  const CliRun r = run("plan");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("replicas"), std::string::npos);
  EXPECT_NE(r.output.find("Recommendation"), std::string::npos) << r.output;
  EXPECT_EQ(run("plan --link-bandwidth fast").code, 2);
  // --params of a few parameters: each slice whole parameters (slices of
  // 0.6 bytes rounded to nothing, and the link's latency with them).
  const CliRun tiny = run("plan --params 10 --compute-ms 1 --replicas 1,2 --json");
  ASSERT_EQ(tiny.code, 0) << tiny.output;
  const auto rows = nlohmann::json::parse(tiny.output)["rows"];
  EXPECT_GT(rows[1]["comm_ms"].get<double>(), 0) << tiny.output;
  // The JSON carries what a program needs without parsing names: the
  // inputs' replica list and compute, each remedy's micro-batch.
  const CliRun json = run("plan --json");
  ASSERT_EQ(json.code, 0) << json.output;
  const auto j = nlohmann::json::parse(json.output);
  EXPECT_EQ(j["inputs"]["replicas"], nlohmann::json::array({1, 2, 4, 8, 16, 32, 64}));
  EXPECT_GT(j["inputs"]["step_compute_ms"].get<double>(), 0);
  int raised = 0;
  for (const auto& a : j["recommendation"]["ranked"]) {
    const std::string name = a["name"];
    if (!name.starts_with("raise --micro-batch to ")) continue;
    ++raised;
    EXPECT_EQ(a["micro_batch"].get<std::int64_t>(), std::stoll(name.substr(23))) << name;
  }
  EXPECT_GT(raised, 0) << json.output;
  const CliRun half = run("plan --params 1.5 --compute-ms 1");
  EXPECT_EQ(half.code, 2) << half.output;
  EXPECT_NE(half.output.find("not a whole number of parameters"), std::string::npos) << half.output;
}

// Horovod's launch schedule from the command line: the inputs echo it, the
// agreement on what is ready costs time, and one all-reduce per layer
// launches as many as the model has layers (the default MLP: 3).
TEST(Cli, PlanLaunchSchedules) {
  const CliRun cycles = run("plan --replicas 8 --launch cycles --cycle-ms 2 --json");
  ASSERT_EQ(cycles.code, 0) << cycles.output;
  const auto c = nlohmann::json::parse(cycles.output);
  EXPECT_EQ(c["inputs"]["launch"], "cycles");
  EXPECT_DOUBLE_EQ(c["inputs"]["cycle_ms"].get<double>(), 2.0);
  EXPECT_GT(c["rows"][0]["negotiation_ms"].get<double>(), 0);
  const CliRun layers = run("plan --replicas 8 --launch layers --json");
  ASSERT_EQ(layers.code, 0) << layers.output;
  EXPECT_EQ(nlohmann::json::parse(layers.output)["rows"][0]["buckets"], 3);
  const CliRun table = run("plan --launch cycles");
  EXPECT_NE(table.output.find("fused every 5 ms up to 25 MiB"), std::string::npos) << table.output;
  EXPECT_NE(run("plan --launch cycles --bucket-mb 0").output.find("every 5 ms, not fused"), std::string::npos);
  EXPECT_EQ(run("plan --launch sometimes").code, 2);
  EXPECT_EQ(run("plan --launch cycles --cycle-ms 0").code, 2);
  // Flags this combination would ignore are errors that name them.
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"plan --published --json", "--published prints the fixed published cases"},
           {"plan --nodes 4 --replicas 1,2", "give it or --replicas, not both"},
           {"plan --model resnet50 --hidden 100", "--hidden shapes the built-in MLP only"},
           {"plan --launch layers --bucket-mb 5", "bucket sizes do not apply"},
           {"plan --launch cycles --first-bucket-mb 3", "drop --first-bucket-mb"},
           {"plan --device-memory 16", "has no unit"},
           // A space around the number (which the unit parser trims) slipped past the
           // check and planned with a device of 16 bytes, every row "does not fit".
           {"plan --device-memory ' 16'", "has no unit"},
           {"plan --device-memory '16 '", "has no unit"},
           {"plan --device-flops 60", "under a million FLOP/s"},
           {"plan --published --device v100", "it takes no --device"},
           {"plan --params 1M --compute-ms 5 --device-flops 1T", "brings its own times"},
           {"plan --profile missing.json --model resnet50", "not several"}}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
  }
  EXPECT_EQ(run("plan --params 7B --compute-ms 100 --device a100 --replicas 1,8").code, 0);
  EXPECT_EQ(run("plan --nodes 0 --replicas 1,2").code, 0);  // 0 is --nodes' default: not given
  EXPECT_NE(run("plan --critical-batch 4096").output.find("cost/M useful"), std::string::npos);
  const CliRun stray = run("plan --cycle-ms 2");
  EXPECT_EQ(stray.code, 2);
  EXPECT_NE(stray.output.find("--cycle-ms applies only with --launch cycles"), std::string::npos) << stray.output;
}

// Stragglers from the command line: the input echoes, the rows carry the
// wait for the slowest replica (none at one replica), and bad values are
// errors naming the flag.
TEST(Cli, PlanStragglers) {
  const CliRun r = run("plan --model resnet50 --replicas 1,64 --compute-cv 0.05 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_DOUBLE_EQ(j["inputs"]["compute_cv"].get<double>(), 0.05);
  EXPECT_EQ(j["rows"][0]["straggler_ms"].get<double>(), 0);
  EXPECT_GT(j["rows"][1]["straggler_ms"].get<double>(), 0);
  EXPECT_NE(run("plan --compute-cv 0.05").output.find("compute varies by 0.05 (stragglers)"), std::string::npos);
  for (const char* bad : {"plan --compute-cv -0.1", "plan --compute-cv 2", "plan --compute-cv much"}) {
    const CliRun b = run(bad);
    EXPECT_EQ(b.code, 2) << bad;
    EXPECT_NE(b.output.find("--compute-cv"), std::string::npos) << bad << "\n" << b.output;
  }
}

// The advice's details a reader acts on: raising the batch carries the
// systems-only caveat, the 3-layer MLP's pipeline outline has 3 stages, and
// a latency-bound plan with two buckets is offered one bucket.
TEST(Cli, PlanAdviceDetails) {
  const CliRun r = run("plan");
  ASSERT_EQ(r.code, 0) << r.output;
  // The recommendation is wrapped at 100 columns: read it as one line.
  const std::string unwrapped = std::regex_replace(r.output, std::regex("\n +"), " ");
  EXPECT_NE(unwrapped.find("counts systems cost only"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pipeline x3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("pipeline x4"), std::string::npos) << r.output;
  const CliRun latency = run("plan --link-latency 2ms --link-bandwidth 100Gbit --json");
  ASSERT_EQ(latency.code, 0) << latency.output;
  const auto rec = nlohmann::json::parse(latency.output)["recommendation"];
  EXPECT_EQ(rec["limited_by"], "latency-bound");
  bool one_bucket = false;
  for (const auto& a : rec["ranked"]) one_bucket = one_bucket || a["name"] == "--bucket-mb 0";
  EXPECT_TRUE(one_bucket) << rec.dump();
}

// `lockstep train`'s in-process replicas on a small machine: 8 replicas on 2
// cores compute 4 times as long per step as one, and pay the host's hand-off
// in every round.
TEST(Cli, PlanModelsReplicasSharingCores) {
  const CliRun alone = run("plan --replicas 1,8 --json");
  const CliRun shared = run("plan --replicas 1,8 --host-cores 2 --host-latency 20us --json");
  ASSERT_EQ(alone.code, 0) << alone.output;
  ASSERT_EQ(shared.code, 0) << shared.output;
  const auto a = nlohmann::json::parse(alone.output)["rows"];
  const auto s = nlohmann::json::parse(shared.output)["rows"];
  EXPECT_DOUBLE_EQ(s[0]["compute_ms"].get<double>(), a[0]["compute_ms"].get<double>());
  EXPECT_NEAR(s[1]["compute_ms"].get<double>(), 4 * a[1]["compute_ms"].get<double>(), 1e-9);
  EXPECT_GT(s[1]["alpha_ms"].get<double>(), a[1]["alpha_ms"].get<double>());
  // 8 replicas fill the 2 cores: one bucket, as lockstep train takes there,
  // unless a bucket flag is given.
  EXPECT_EQ(a[1]["buckets"], 2);
  EXPECT_EQ(s[1]["buckets"], 1);
  const CliRun flagged = run("plan --replicas 1,8 --host-cores 2 --host-latency 20us --bucket-mb 25 --json");
  ASSERT_EQ(flagged.code, 0) << flagged.output;
  EXPECT_EQ(nlohmann::json::parse(flagged.output)["rows"][1]["buckets"], 2);
  // The JSON says what it was given (it left both out).
  const auto inputs = nlohmann::json::parse(shared.output)["inputs"];
  EXPECT_EQ(inputs["host_cores"], 2);
  EXPECT_NEAR(inputs["host_latency_us"].get<double>(), 20, 1e-9);
  const CliRun bad = run("plan --host-latency 5");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("bad --host-latency '5'"), std::string::npos) << bad.output;
  EXPECT_EQ(run("plan --host-cores -1").code, 2);
}

}  // namespace

namespace {

// For the --auto-resume tests: a tiny data set, an empty directory `out`
// holding the unbroken run's weights (whole.st), and the train command they
// share, of 12 steps with a checkpoint every 4 (`common`, to add to).
struct AutoResumeCase {
  fs::path out;
  std::string common;
  bool files_equal(const std::string& a, const std::string& b) const {
    std::ifstream x(out / a, std::ios::binary), y(out / b, std::ios::binary);
    return std::equal(std::istreambuf_iterator<char>(x), {}, std::istreambuf_iterator<char>(y), {});
  }
};
AutoResumeCase auto_resume_case(const std::string& name) {
  AutoResumeCase k;
  const fs::path dir = make_data_dir(name);
  k.out = fs::path(LOCKSTEP_TEST_TMPDIR) / (name + "_out");
  fs::remove_all(k.out);
  fs::create_directories(k.out);
  k.common = "train --data " + dir.string() + " --replicas 2 --micro-batch 8 --hidden 8 --steps 12" + kStatedPeak +
             "--checkpoint-every 4 ";
  const CliRun whole = run(k.common + "--quiet --save " + (k.out / "whole.st").string() + " --checkpoint " +
                           (k.out / "whole_checkpoint.st").string());
  EXPECT_EQ(whole.code, 0) << whole.output;
  return k;
}

// --auto-resume (Note [Restarts], cli/restarts.cpp): no file, a fresh
// run; the file of a run stopped early, that run's end, bit for bit; the
// file of an ended run, that run's end again; of other settings, refused
// with --auto-resume's remedies. LOCKSTEP_RESTART_COUNT > 0 (set by lockstep launch
// --max-restarts) leaves the injected faults out.
TEST(Cli, AutoResumeGoesOnFromTheCheckpointWhenItIsThere) {
  const AutoResumeCase k = auto_resume_case("cli_auto_resume");
  const fs::path& out = k.out;
  const std::string& common = k.common;

  const std::string checkpoint = (out / "c.st").string();
  const std::string auto_resume = "--checkpoint " + checkpoint + " --auto-resume ";
  // The first run fails at step 6, after the checkpoint of step 4 (its fault
  // fires: no restart count).
  const CliRun first = run(common + auto_resume + "--quiet --inject throw@6:1");
  ASSERT_EQ(first.code, 1) << first.output;
  ASSERT_TRUE(fs::exists(checkpoint));
  // Run again as a restart: the fault is left out, and the run goes on from step 4.
  const CliRun again = run_command("LOCKSTEP_RESTART_COUNT=1 " + std::string(LOCKSTEP_CLI) + " " + common + auto_resume +
                           "--inject throw@6:1 --save " + (out / "again.st").string());
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("restart 1 of the job (--inject faults fire in its first run only)"), std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("--auto-resume: going on from " + checkpoint + " after step 4"), std::string::npos)
      << again.output;
  EXPECT_TRUE(k.files_equal("whole.st", "again.st")) << "the resumed run's weights differ from the unbroken run's";
  // Rank 0 broadcast the checkpoint's optimizer state with the weights; the
  // summary named the weights only.
  EXPECT_NE(again.output.find(" more of the checkpoint's state for --resume), 0 B after"), std::string::npos)
      << again.output;
  // Its final loss is the unbroken run's last window, steps 9 to 12 after
  // the epoch's end at 8, so no note that its window was cut by the resume.
  EXPECT_EQ(again.output.find("a resumed run's loss window"), std::string::npos) << again.output;

  // The checkpoint now holds the ended job (Note [A job that had ended]): a
  // job restarted after its last checkpoint runs no step, and ends as the
  // unbroken job, with its weights and their test accuracy; what draws steps
  // is not written, and says why. Another --lr is another run.
  const CliRun ended = run(common + auto_resume + "--save " + (out / "ended.st").string() + " --timeline-svg " +
                           (out / "ended.svg").string() + " --report " + (out / "ended.json").string());
  ASSERT_EQ(ended.code, 0) << ended.output;
  EXPECT_NE(ended.output.find("--auto-resume: " + checkpoint + " holds the job's last step (12); no step is left"),
            std::string::npos)
      << ended.output;
  EXPECT_TRUE(k.files_equal("whole.st", "ended.st")) << "the ended job's weights differ from the unbroken job's";
  const auto accuracy = [](const std::string& output) {
    const auto at = output.find(", test accuracy ");
    return at == std::string::npos ? std::string("none") : output.substr(at, 22);
  };
  EXPECT_EQ(accuracy(ended.output), accuracy(again.output)) << ended.output;
  EXPECT_NE(ended.output.find("final loss not known (no step ran)"), std::string::npos) << ended.output;
  // It checked nothing, and does not say it did ("compared ... (0 checks)", "read exactly once").
  EXPECT_NE(ended.output.find("this run made no step, so it compared and audited nothing"), std::string::npos)
      << ended.output;
  EXPECT_EQ(ended.output.find("read exactly once"), std::string::npos) << ended.output;
  EXPECT_NE(ended.output.find("--timeline-svg not written: this run went on from " + checkpoint), std::string::npos)
      << ended.output;
  EXPECT_FALSE(fs::exists(out / "ended.svg"));
  const auto report = nlohmann::json::parse(std::ifstream(out / "ended.json"));
  EXPECT_EQ(report["resumed_from_step"], 12);
  EXPECT_EQ(report["steps"], 12);
  // No step ran, so there is no loss and no window of steps it is over (the
  // report said [1, 12] beside the null loss).
  EXPECT_TRUE(report["final_loss"].is_null()) << report["final_loss"];
  EXPECT_TRUE(report["final_loss_steps"].is_null()) << report["final_loss_steps"];
  // Run again, it keeps the report there (of the run that trained, or a
  // job run again after it ended): a run of no step has no timings to give.
  {
    std::ofstream(out / "ended.json") << "{\"from\": \"the run that trained\"}";
  }
  const CliRun again_ended = run(common + auto_resume + "--report " + (out / "ended.json").string());
  ASSERT_EQ(again_ended.code, 0) << again_ended.output;
  EXPECT_NE(again_ended.output.find("--report not written: " + (out / "ended.json").string() +
                                    " is there already, from the run that trained, and this run ran no step; it is "
                                    "kept."),
            std::string::npos)
      << again_ended.output;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(out / "ended.json"))["from"], "the run that trained");
  const CliRun other = run(common + auto_resume + "--quiet --lr 0.05");
  EXPECT_EQ(other.code, 2) << other.output;
  EXPECT_NE(other.output.find("--auto-resume found " + checkpoint + ", and cannot go on from it: --lr differs from "
                              "the run that wrote the checkpoint ('0.1' there, '0.05' here)"),
            std::string::npos)
      << other.output;
  EXPECT_NE(other.output.find("give another --checkpoint file to start afresh."), std::string::npos) << other.output;

  const CliRun bad = run_command("LOCKSTEP_RESTART_COUNT=x " + std::string(LOCKSTEP_CLI) + " " + common + auto_resume + "--quiet");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("LOCKSTEP_RESTART_COUNT is 'x', not a whole number"), std::string::npos) << bad.output;
}

// --auto-resume is the one command every run of a job runs (Note [Restarts]):
// a --timeline-step that an earlier run of the job passed cannot be drawn
// by the run that goes on after it, and is no reason to refuse that run
// (lockstep launch does not restart a refused one, and the job is lost); it
// goes on to the unbroken run's weights, and says why there is no timeline.
// --resume, given by hand, still refuses it.
TEST(Cli, AutoResumePastTheTimelineStepGoesOnWithoutTheTimeline) {
  const AutoResumeCase k = auto_resume_case("cli_auto_resume_timeline");
  const fs::path& out = k.out;
  const std::string common = k.common + "--quiet ";

  const std::string checkpoint = (out / "c.st").string();
  const std::string job = common + "--checkpoint " + checkpoint + " --auto-resume --timeline-svg " +
                          (out / "t.svg").string() + " --timeline-step 2 --inject throw@6:1 --save " +
                          (out / "again.st").string();
  const CliRun first = run(job);
  ASSERT_EQ(first.code, 1) << first.output;
  ASSERT_TRUE(fs::exists(checkpoint));
  fs::copy_file(checkpoint, out / "mid.st");
  const CliRun again = run_command("LOCKSTEP_RESTART_COUNT=1 " + std::string(LOCKSTEP_CLI) + " " + job);
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("--timeline-svg not written: --timeline-step 2 ran before step 4, where this run "
                              "went on from " + checkpoint + " (--auto-resume)"),
            std::string::npos)
      << again.output;
  EXPECT_FALSE(fs::exists(out / "t.svg"));
  EXPECT_TRUE(k.files_equal("whole.st", "again.st")) << "the resumed run's weights differ from the unbroken run's";

  const CliRun by_hand = run(common + "--checkpoint " + (out / "h.st").string() + " --resume " +
                             (out / "mid.st").string() + " --timeline-svg " +
                             (out / "t.svg").string() + " --timeline-step 2");
  EXPECT_EQ(by_hand.code, 2) << by_hand.output;
  EXPECT_NE(by_hand.output.find("--timeline-step 2 is before step 4, where this run goes on from its checkpoint"),
            std::string::npos)
      << by_hand.output;
}

// The guards from the command line: an injected bit flip stops the run
// naming the rank; repair warns and finishes; a NaN step is skipped by all.
TEST(Cli, InjectedFaultsAreCaughtByTheGuards) {
  const fs::path dir = make_data_dir("cli_guards");
  const std::string common =
      "train --data " + dir.string() + " --replicas 4 --micro-batch 4 --hidden 8 --steps 6" + kStatedPeak;
  const CliRun stop = run(common + "--check-every 1 --inject bitflip@2:3");
  EXPECT_EQ(stop.code, 1);
  EXPECT_NE(stop.output.find("replicas diverged by step 2:"), std::string::npos) << stop.output;
  EXPECT_NE(stop.output.find("on rank 3 differs"), std::string::npos) << stop.output;
  const fs::path report = dir / "repair.json";
  const CliRun repair =
      run(common + "--check-every 1 --inject bitflip@2:3 --on-divergence repair --report " + report.string());
  EXPECT_EQ(repair.code, 0) << repair.output;
  EXPECT_NE(repair.output.find("lockstep: warning: replicas diverged"), std::string::npos) << repair.output;
  EXPECT_NE(repair.output.find("1 repair)"), std::string::npos) << repair.output;
  // The repair sent weights after the start, and the summary and report say so.
  EXPECT_NE(repair.output.find(" after by all replicas over the run (re-broadcast with the optimizer state by 1 "
                               "--on-divergence repair)"),
            std::string::npos)
      << repair.output;
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  std::uint64_t repair_bytes = 0;
  for (const auto& sent : j["bytes"]["per_replica_sent"]) repair_bytes += sent["repair"].get<std::uint64_t>();
  // 16-8-3 MLP: 163 weights and 163 momentum floats reach each of the 3 other replicas.
  EXPECT_GE(repair_bytes, 3u * 2 * 163 * 4);
  EXPECT_EQ(j["bytes"]["weights_exchanged_after_init"], repair_bytes);
  EXPECT_EQ(j["bytes"]["activations_communicated"], 0);
  const CliRun nan = run(common + "--inject nan@1:2");
  EXPECT_EQ(nan.code, 0) << nan.output;
  EXPECT_NE(nan.output.find("step 1: non-finite gradient on rank 2"), std::string::npos) << nan.output;
  EXPECT_NE(nan.output.find("1 step skipped"), std::string::npos) << nan.output;
  const CliRun thrown = run(common + "--inject throw@1:2");
  EXPECT_EQ(thrown.code, 1);
  EXPECT_NE(thrown.output.find("rank 2: injected failure at step 1"), std::string::npos) << thrown.output;
  EXPECT_EQ(run(common + "--inject bitflip@2").code, 2);
  EXPECT_EQ(run(common + "--on-divergence ignore").code, 2);
  // A flip with the detector off is the card's silent failure, shown on
  // purpose: allowed, with a warning that nothing will catch it.
  const CliRun unchecked = run(common + "--check-every 0 --inject bitflip@2:3");
  EXPECT_EQ(unchecked.code, 0) << unchecked.output;
  EXPECT_NE(unchecked.output.find("warning: --check-every 0 turns the divergence detector off"), std::string::npos)
      << unchecked.output;
}

}  // namespace
