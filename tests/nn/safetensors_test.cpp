#include "lockstep/nn/safetensors.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "lockstep/error.h"
#include "temp_dir_test.h"

namespace lockstep::nn {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

class SafetensorsTest : public lockstep::testing::TempDirTest {
 protected:
  static std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string le64(std::uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    return s;
  }
  static std::string float_bytes(std::initializer_list<float> values) {
    std::string s;
    for (float f : values) {
      const auto bits = std::bit_cast<std::uint32_t>(f);
      for (int i = 0; i < 4; ++i) s += static_cast<char>((bits >> (8 * i)) & 0xff);
    }
    return s;
  }
  // A file with the given header (no padding) and data section.
  fs::path hand_built(const std::string& name, const std::string& header, const std::string& data) {
    const fs::path p = dir_ / name;
    write_bytes(p, le64(header.size()) + header + data);
    return p;
  }
  // Loading `p` throws IoError whose message names the file and contains `needle`.
  static void expect_io_error(const fs::path& p, const std::string& needle) {
    try {
      load_safetensors(p);
      ADD_FAILURE() << "no IoError for " << p;
    } catch (const IoError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(p.filename().string()), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << "expected '" << needle << "' in: " << what;
    }
  }
  std::size_t files_in_dir() const {
    return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }
};

TEST_F(SafetensorsTest, RoundTripKeepsNamesShapesBitsAndMetadata) {
  const float nan_payload = std::bit_cast<float>(0x7fc12345u);
  std::vector<float> w = {
      1.5f,        -0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity(),
      nan_payload, 3e38f};
  std::vector<float> b = {0.25f, -7.0f};
  std::vector<float> scalar = {42.0f};
  std::vector<TensorRef> refs = {
      {"layer.w", {2, 3}, w}, {"empty", {0, 5}, {}}, {"a.bias", {2}, b}, {"scalar", {}, scalar}};
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "grüße \"quoted\""}};
  const fs::path p = dir_ / "round.safetensors";
  save_safetensors(p, refs, meta);

  const SafetensorsFile f = load_safetensors(p);
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), refs.size());
  for (std::size_t i = 0; i < refs.size(); ++i) {  // data order == given order
    SCOPED_TRACE(refs[i].name);
    EXPECT_EQ(f.tensors[i].name, refs[i].name);
    EXPECT_EQ(f.tensors[i].shape, refs[i].shape);
    ASSERT_EQ(f.tensors[i].data.size(), refs[i].data.size());
    for (std::size_t j = 0; j < refs[i].data.size(); ++j)  // bitwise: NaN payload, -0.0
      EXPECT_EQ(std::bit_cast<std::uint32_t>(f.tensors[i].data[j]),
                std::bit_cast<std::uint32_t>(refs[i].data[j]));
  }
  EXPECT_EQ(files_in_dir(), 1u);  // no temporary file left behind
}

TEST_F(SafetensorsTest, ByteLayoutFollowsTheSpec) {
  std::vector<float> x = {1.0f, 2.0f};
  std::vector<float> y = {3.0f};
  std::vector<TensorRef> refs = {{"x", {2}, x}, {"y", {1, 1}, y}};
  const fs::path p = dir_ / "layout.safetensors";
  save_safetensors(p, refs, {{"format", "pt"}});

  const std::string bytes = read_bytes(p);
  ASSERT_GE(bytes.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  ASSERT_EQ(bytes.size(), 8 + n + 12);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  const std::size_t close = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "padding must be spaces";

  const Json h = Json::parse(header);
  ASSERT_TRUE(h.is_object());
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h["__metadata__"], Json({{"format", "pt"}}));
  EXPECT_EQ(h["x"]["dtype"], "F32");
  EXPECT_EQ(h["x"]["shape"], Json::array({2}));
  EXPECT_EQ(h["x"]["data_offsets"], Json::array({0, 8}));
  EXPECT_EQ(h["y"]["dtype"], "F32");
  EXPECT_EQ(h["y"]["shape"], Json::array({1, 1}));
  EXPECT_EQ(h["y"]["data_offsets"], Json::array({8, 12}));
  EXPECT_EQ(bytes.substr(8 + n), float_bytes({1.0f, 2.0f, 3.0f}));
}

TEST_F(SafetensorsTest, EmptyFileHasOnlyABraceHeader) {
  const fs::path p = dir_ / "nothing.safetensors";
  save_safetensors(p, {});
  const std::string bytes = read_bytes(p);
  ASSERT_EQ(bytes.size(), 16u);
  EXPECT_EQ(bytes.substr(0, 8), le64(8));
  EXPECT_EQ(bytes.substr(8), "{}      ");
  const SafetensorsFile f = load_safetensors(p);
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
}

TEST_F(SafetensorsTest, LoadsHandBuiltUnpaddedFileInDataOrder) {
  // Header lists "late" first, but its data comes second; no padding, data unaligned.
  const std::string header = R"({"late":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                             R"("__metadata__":{"k":"v"},)"
                             R"("early":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + header.size()) % 4, 0u);
  const fs::path p = hand_built("hand.safetensors", header, float_bytes({-1.0f, 0.5f, 9.0f}));
  const SafetensorsFile f = load_safetensors(p);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"k", "v"}}));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].name, "early");
  EXPECT_EQ(f.tensors[0].shape, (std::vector<std::int64_t>{2, 1}));
  EXPECT_EQ(f.tensors[0].data, (std::vector<float>{-1.0f, 0.5f}));
  EXPECT_EQ(f.tensors[1].name, "late");
  EXPECT_EQ(f.tensors[1].shape, (std::vector<std::int64_t>{1}));
  EXPECT_EQ(f.tensors[1].data, (std::vector<float>{9.0f}));
}

TEST_F(SafetensorsTest, RejectsMissingAndShortFiles) {
  expect_io_error(dir_ / "missing.safetensors", "cannot open");
  write_bytes(dir_ / "short.safetensors", "abc");
  expect_io_error(dir_ / "short.safetensors", "shorter than the 8-byte");
  // stat says 0 bytes, and it reads: not "the file is 0 bytes".
  if (fs::exists("/proc/self/status")) expect_io_error("/proc/self/status", "a /proc or /sys pseudo-file");
}

TEST_F(SafetensorsTest, RejectsBadHeaderLengths) {
  write_bytes(dir_ / "huge_len.safetensors", le64(9000000000000000000ull) + "{}");
  expect_io_error(dir_ / "huge_len.safetensors", "larger than the file");
  // Length over the limit but within the (sparse) file: refused without reading it.
  const fs::path big = dir_ / "over_limit.safetensors";
  write_bytes(big, le64(kMaxSafetensorsHeaderBytes + 1));
  fs::resize_file(big, kMaxSafetensorsHeaderBytes + 64);
  expect_io_error(big, "100 MiB");
}

TEST_F(SafetensorsTest, RejectsHeadersThatAreNotSafetensorsJson) {
  expect_io_error(hand_built("syntax.safetensors", R"({"a":)", ""), "not valid JSON");
  expect_io_error(hand_built("array.safetensors", "[1,2]", ""), "not a JSON object");
  expect_io_error(hand_built("number.safetensors", "7", ""), "not a JSON object");
  expect_io_error(hand_built("entry.safetensors", R"({"a":3})", ""), "not an object");
  expect_io_error(hand_built("nested.safetensors", R"({"a":{"shape":[[[]]]}})", ""), "nested");
  expect_io_error(hand_built("dup.safetensors",
                             R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                             float_bytes({1.0f})),
                  "twice");
  expect_io_error(hand_built("meta.safetensors", R"({"__metadata__":{"k":1}})", ""), "not a string");
  // A field twice in one entry, or a metadata key twice: the last would win silently.
  expect_io_error(hand_built("dup_field.safetensors",
                             R"({"a":{"dtype":"BF16","shape":[2],"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                             float_bytes({1.0f})),
                  "tensor 'a' lists 'dtype' twice");
  expect_io_error(hand_built("dup_meta.safetensors", R"({"__metadata__":{"k":"1","k":"2"}})", ""),
                  "metadata lists 'k' twice");
}

TEST_F(SafetensorsTest, RejectsHeadersThatWouldNeedAbsurdMemory) {
  std::string dims = "[1";
  for (int i = 0; i < 2000; ++i) dims += ",1";
  expect_io_error(hand_built("long_shape.safetensors",
                             R"({"t":{"dtype":"F32","shape":)" + dims + R"(],"data_offsets":[0,4]}})",
                             float_bytes({1.0f})),
                  "more than 1024");
  std::string meta = R"({"__metadata__":{)";
  for (int i = 0; i <= 70000; ++i) meta += (i ? ",\"" : "\"") + std::to_string(i) + "\":\"\"";
  expect_io_error(hand_built("many_meta.safetensors", meta + "}}", ""), "more than 65536");
  // Many tensors claiming the same bytes are refused before any tensor memory is allocated.
  std::string header = "{";
  for (int i = 0; i < 1000; ++i)
    header += (i ? ",\"" : "\"") + std::to_string(i) +
              R"(":{"dtype":"F32","shape":[262144],"data_offsets":[0,1048576]})";
  const fs::path p = hand_built("overlap_many.safetensors", header + "}", "");
  fs::resize_file(p, fs::file_size(p) + 1048576);
  expect_io_error(p, "overlap");
}

TEST_F(SafetensorsTest, RejectsIncompleteOrUnsupportedEntries) {
  const std::string data = float_bytes({1.0f});
  expect_io_error(hand_built("no_dtype.safetensors", R"({"t":{"shape":[1],"data_offsets":[0,4]}})", data),
                  "\"dtype\"");
  expect_io_error(hand_built("no_shape.safetensors", R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", data),
                  "\"shape\"");
  expect_io_error(hand_built("no_offsets.safetensors", R"({"t":{"dtype":"F32","shape":[1]}})", data),
                  "\"data_offsets\"");
  const fs::path bf16 =
      hand_built("bf16.safetensors", R"({"t":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", data);
  expect_io_error(bf16, "BF16");
  expect_io_error(bf16, "only F32 is supported");
  expect_io_error(
      hand_built("neg.safetensors", R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", data),
      "negative");
}

TEST_F(SafetensorsTest, RejectsBadOffsets) {
  const std::string data = float_bytes({1.0f, 2.0f});
  auto entry = [](const std::string& name, const std::string& shape, const std::string& offsets) {
    return "\"" + name + R"(":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
  };
  expect_io_error(hand_built("past_end.safetensors", "{" + entry("t", "[2]", "[4,12]") + "}", data),
                  "past the end");
  expect_io_error(hand_built("reversed.safetensors", "{" + entry("t", "[0]", "[8,0]") + "}", data),
                  "end before begin");
  expect_io_error(hand_built("wrong_len.safetensors", "{" + entry("t", "[1]", "[0,8]") + "}", data),
                  "span 8 bytes");
  expect_io_error(
      hand_built("too_many.safetensors", "{" + entry("t", "[4294967296,4294967296]", "[0,8]") + "}", data),
      "more values");
  expect_io_error(hand_built("overlap.safetensors",
                             "{" + entry("a", "[2]", "[0,8]") + "," + entry("b", "[1]", "[4,8]") + "}", data),
                  "overlap");
  expect_io_error(hand_built("gap.safetensors", "{" + entry("a", "[1]", "[4,8]") + "}", data),
                  "belong to no tensor");
  expect_io_error(hand_built("tail.safetensors", "{" + entry("a", "[1]", "[0,4]") + "}", data),
                  "belong to no tensor");
}

TEST_F(SafetensorsTest, SaveRejectsBadArgumentsAndLeavesExistingFileIntact) {
  std::vector<float> v = {1.0f, 2.0f, 3.0f};
  const fs::path p = dir_ / "keep.safetensors";
  save_safetensors(p, std::vector<TensorRef>{{"v", {3}, v}});
  const std::string before = read_bytes(p);

  std::vector<TensorRef> mismatched = {{"v", {2, 2}, v}};
  EXPECT_THROW(save_safetensors(p, mismatched), InvalidArgument);
  std::vector<TensorRef> duplicate = {{"v", {3}, v}, {"v", {3}, v}};
  EXPECT_THROW(save_safetensors(p, duplicate), InvalidArgument);
  std::vector<TensorRef> negative = {{"v", {-3}, v}};
  EXPECT_THROW(save_safetensors(p, negative), InvalidArgument);
  std::vector<TensorRef> reserved = {{"__metadata__", {3}, v}};
  EXPECT_THROW(save_safetensors(p, reserved), InvalidArgument);
  std::vector<TensorRef> bad_utf8 = {{"\xff", {3}, v}};
  EXPECT_THROW(save_safetensors(p, bad_utf8), InvalidArgument);

  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(files_in_dir(), 1u);
}

TEST_F(SafetensorsTest, SaveIntoMissingDirectoryThrowsIoErrorNamingThePath) {
  std::vector<float> v = {1.0f};
  const fs::path p = dir_ / "no_such_dir" / "out.safetensors";
  try {
    save_safetensors(p, std::vector<TensorRef>{{"v", {1}, v}});
    ADD_FAILURE() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(p.parent_path()));
}

TEST_F(SafetensorsTest, FailedRenameRemovesTemporaryFile) {
  // The target is a non-empty directory: the data is written, then the rename fails.
  const fs::path p = dir_ / "target.safetensors";
  fs::create_directories(p / "child");
  std::vector<float> v = {1.0f};
  EXPECT_THROW(save_safetensors(p, std::vector<TensorRef>{{"v", {1}, v}}), IoError);
  EXPECT_TRUE(fs::is_directory(p / "child"));
  EXPECT_EQ(files_in_dir(), 1u);
}

TEST_F(SafetensorsTest, SaveReplacesExistingFile) {
  std::vector<float> a = {1.0f, 2.0f};
  std::vector<float> b = {5.0f};
  const fs::path p = dir_ / "replace.safetensors";
  save_safetensors(p, std::vector<TensorRef>{{"a", {2}, a}});
  save_safetensors(p, std::vector<TensorRef>{{"b", {1}, b}}, {{"step", "2"}});
  const SafetensorsFile f = load_safetensors(p);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].name, "b");
  EXPECT_EQ(f.tensors[0].data, b);
  EXPECT_EQ(f.metadata.at("step"), "2");
}

// A process killed while it writes a checkpoint (here by its file-size
// limit, SIGXFSZ, as SIGKILL or the OOM killer would) leaves the old file as
// it was and no temporary beside it (Note [Nothing left by a killed writer]).
TEST_F(SafetensorsTest, AWriterKilledMidWriteLeavesTheOldFileAndNoTemporary) {
  const fs::path p = dir_ / "checkpoint.safetensors";
  std::vector<float> old_values = {1.0f, 2.0f};
  save_safetensors(p, std::vector<TensorRef>{{"w", {2}, old_values}});
  const std::string before = read_bytes(p);
  const std::vector<float> big(1 << 20, 3.0f);  // 4 MiB, against a limit of 64 KiB
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit no_core{0, 0}, small{64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::setrlimit(RLIMIT_FSIZE, &small);
    ::signal(SIGXFSZ, SIG_DFL);
    try {
      save_safetensors(p, std::vector<TensorRef>{{"w", {1 << 20}, big}});
    } catch (...) {
    }
    ::_exit(0);  // not reached: the limit kills the writer
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ) << "status " << status;
  EXPECT_EQ(read_bytes(p), before);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"checkpoint.safetensors"});
}

// Where an unnamed file cannot be given a name (no /proc here: a mount
// namespace without it), the write takes a named temporary and still
// replaces the file whole.
TEST_F(SafetensorsTest, WithoutProcToNameAnUnnamedFileANamedTemporaryIsUsed) {
  const fs::path p = dir_ / "checkpoint.safetensors";
  std::vector<float> old_values = {1.0f, 2.0f};
  save_safetensors(p, std::vector<TensorRef>{{"w", {2}, old_values}});
  // 1 MiB of values: the bytes the child writes (wchar of /proc/self/io,
  // opened before /proc goes) show whether they went out once or twice.
  std::vector<float> new_values(1 << 18);
  for (std::size_t i = 0; i < new_values.size(); ++i) new_values[i] = static_cast<float>(i % 1000);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int io = ::open("/proc/self/io", O_RDONLY | O_CLOEXEC);
    const auto written = [io]() -> long long {  // wchar, or -1
      char text[512] = {};
      if (io < 0 || ::pread(io, text, sizeof text - 1, 0) <= 0) return -1;
      const char* at = std::strstr(text, "wchar: ");
      return at == nullptr ? -1 : std::atoll(at + 7);
    };
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::umount2("/proc", MNT_DETACH) != 0 || fs::exists("/proc/self")) {
      ::_exit(77);
    }
    const long long before = written();
    try {
      save_safetensors(p, std::vector<TensorRef>{{"w", {static_cast<std::int64_t>(new_values.size())}, new_values}});
    } catch (...) {
      ::_exit(1);
    }
    const long long bytes = written() - before;
    if (before < 0) ::_exit(78);  // no I/O accounting: the rest is still checked
    // Written once: the file's size, not twice that (an unnamed file first,
    // then, unable to name it, a named one).
    ::_exit(bytes < static_cast<long long>(fs::file_size(p)) * 3 / 2 ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot make a mount namespace without /proc here (needs root)";
  ASSERT_NE(WEXITSTATUS(status), 1) << "the write failed";
  EXPECT_NE(WEXITSTATUS(status), 2) << "the contents were written twice";
  EXPECT_TRUE(WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 78) << "status " << WEXITSTATUS(status);
  const SafetensorsFile f = load_safetensors(p);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].data, new_values);
  EXPECT_EQ(files_in_dir(), 1u);
}

}  // namespace
}  // namespace lockstep::nn
