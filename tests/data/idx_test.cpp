#include "lockstep/data/idx.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <chrono>
#include <future>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <new>
#include <string>
#include <vector>

#include "lockstep/error.h"
#include "temp_dir_test.h"

// Test-only instrumentation: record the largest single operator-new request so
// the hostile-header tests can prove nothing big was allocated.
namespace {
std::atomic<std::size_t> largest_allocation{0};
}  // namespace

// noinline keeps GCC from pairing the inlined free() with operator new and
// warning (-Wmismatched-new-delete) about a mismatch that is not there.
[[gnu::noinline]] void* operator new(std::size_t n) {
  std::size_t prev = largest_allocation.load(std::memory_order_relaxed);
  while (n > prev && !largest_allocation.compare_exchange_weak(prev, n)) {
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace lockstep::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

Bytes pattern(std::size_t n) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>((i * 37 + 11) % 251);
  return b;
}

// Magic plus big-endian dims, as an IDX header.
Bytes header(std::uint8_t type, std::initializer_list<std::uint32_t> dims) {
  Bytes h = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) h.push_back(static_cast<std::uint8_t>(d >> shift));
  }
  return h;
}

Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void write_raw(const fs::path& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  ASSERT_TRUE(out.good()) << p;
}

Bytes read_raw(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// gzip-compresses `b` into p as a single gzip member (or none if b is empty).
void write_gzip_raw(const fs::path& p, const Bytes& b) {
  gzFile gz = gzopen(p.c_str(), "wb");
  ASSERT_NE(gz, nullptr) << p;
  if (!b.empty()) {
    ASSERT_EQ(gzwrite(gz, b.data(), static_cast<unsigned>(b.size())), static_cast<int>(b.size()));
  }
  ASSERT_EQ(gzclose(gz), Z_OK);
}

class IdxTest : public lockstep::testing::TempDirTest {
 protected:
  // Runs read_idx on `p`, expects IoError, and checks the message names the
  // file and contains every word in `words`.
  void expect_read_error(const fs::path& p, std::initializer_list<std::string> words) {
    try {
      read_idx(p);
      ADD_FAILURE() << "read_idx(" << p << ") did not throw";
    } catch (const IoError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p.filename().string()), std::string::npos) << msg;
      for (const auto& w : words)
        EXPECT_NE(msg.find(w), std::string::npos) << "want '" << w << "' in: " << msg;
    }
  }
};

TEST_F(IdxTest, RoundTripPlainWritesExactBytes) {
  const std::vector<std::int64_t> dims = {3, 2, 4};
  const Bytes data = pattern(24);
  const fs::path p = dir_ / "a-idx3-ubyte";
  write_idx(p, 0x08, dims, data, false);
  EXPECT_EQ(read_raw(p), concat(header(0x08, {3, 2, 4}), data));
  const IdxArray a = read_idx(p);
  EXPECT_EQ(a.type_code, 0x08);
  EXPECT_EQ(a.dims, dims);
  EXPECT_EQ(a.bytes, data);
}

TEST_F(IdxTest, RoundTripGzip) {
  const std::vector<std::int64_t> dims = {100, 28, 28};
  const Bytes data = pattern(100 * 28 * 28);
  const fs::path p = dir_ / "a-idx3-ubyte.gz";
  write_idx(p, 0x08, dims, data, true);
  const Bytes raw = read_raw(p);
  ASSERT_GE(raw.size(), 2u);
  EXPECT_EQ(raw[0], 0x1f);
  EXPECT_EQ(raw[1], 0x8b);
  const IdxArray a = read_idx(p);
  EXPECT_EQ(a.type_code, 0x08);
  EXPECT_EQ(a.dims, dims);
  EXPECT_EQ(a.bytes, data);
}

TEST_F(IdxTest, GzipDetectedByMagicNotName) {
  const std::vector<std::int64_t> dims = {5};
  const Bytes data = pattern(5);
  write_idx(dir_ / "plain.gz", 0x08, dims, data, false);
  write_idx(dir_ / "compressed", 0x08, dims, data, true);
  EXPECT_EQ(read_idx(dir_ / "plain.gz").bytes, data);
  EXPECT_EQ(read_idx(dir_ / "compressed").bytes, data);
}

TEST_F(IdxTest, ConcatenatedGzipMembersReadAsOneStream) {
  const Bytes whole = concat(header(0x08, {6, 10}), pattern(60));
  const fs::path a = dir_ / "a.gz", b = dir_ / "b.gz", p = dir_ / "joined.gz";
  write_gzip_raw(a, Bytes(whole.begin(), whole.begin() + 30));
  write_gzip_raw(b, Bytes(whole.begin() + 30, whole.end()));
  write_raw(p, concat(read_raw(a), read_raw(b)));
  EXPECT_EQ(read_idx(p).bytes, pattern(60));
}

TEST_F(IdxTest, MultiByteTypesUseTheirElementSize) {
  EXPECT_EQ(idx_element_size(0x08), 1u);
  EXPECT_EQ(idx_element_size(0x09), 1u);
  EXPECT_EQ(idx_element_size(0x0B), 2u);
  EXPECT_EQ(idx_element_size(0x0C), 4u);
  EXPECT_EQ(idx_element_size(0x0D), 4u);
  EXPECT_EQ(idx_element_size(0x0E), 8u);
  EXPECT_EQ(idx_element_size(0x0A), 0u);
  const std::vector<std::int64_t> dims = {5};
  const fs::path p = dir_ / "ints";
  write_idx(p, 0x0C, dims, pattern(20), false);
  const IdxArray a = read_idx(p);
  EXPECT_EQ(a.type_code, 0x0C);
  EXPECT_EQ(a.bytes, pattern(20));
  // 5 float64s need 40 bytes; 20 is truncated.
  write_raw(p, concat(header(0x0E, {5}), pattern(20)));
  expect_read_error(p, {"truncated", "40", "20"});
}

TEST_F(IdxTest, MissingFile) {
  expect_read_error(dir_ / "nope-idx1-ubyte", {"no such file"});
}

TEST_F(IdxTest, DirectoryIsNotAFile) {
  fs::create_directories(dir_ / "sub-idx1-ubyte");
  expect_read_error(dir_ / "sub-idx1-ubyte", {"directory"});
}

// A FIFO with no writer blocked the open for good; now it is refused at
// once, as anything that is not a regular file.
TEST_F(IdxTest, AFifoIsRefusedNotWaitedOn) {
  const fs::path fifo = dir_ / "fifo-idx1-ubyte";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto read = std::async(std::launch::async, [&] { expect_read_error(fifo, {"not a regular file"}); });
  if (read.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "read_idx waited on the FIFO";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // a writer, then EOF: the read ends
    if (fd >= 0) ::close(fd);
  }
  read.wait();
}

TEST_F(IdxTest, EmptyFileAndEmptyGzip) {
  write_raw(dir_ / "empty", {});
  expect_read_error(dir_ / "empty", {"empty"});
  write_gzip_raw(dir_ / "empty.gz", {});
  ASSERT_GT(fs::file_size(dir_ / "empty.gz"), 0u);
  expect_read_error(dir_ / "empty.gz", {"empty", "gzip"});
}

TEST_F(IdxTest, BadMagic) {
  write_raw(dir_ / "zip", {'P', 'K', 3, 4, 0, 0, 0, 0});
  expect_read_error(dir_ / "zip", {"magic", "50 4b 03 04", "not an IDX file"});
  // An IDX file gzipped twice: after one decompression it still starts 1f 8b.
  write_idx(dir_ / "once.gz", 0x08, std::vector<std::int64_t>{4}, pattern(4), true);
  write_gzip_raw(dir_ / "twice.gz", read_raw(dir_ / "once.gz"));
  expect_read_error(dir_ / "twice.gz", {"magic", "1f 8b 08 00", "after decompression"});
}

TEST_F(IdxTest, ShortMagicIsTruncated) {
  write_raw(dir_ / "short", {0, 0});
  expect_read_error(dir_ / "short", {"truncated", "2 bytes"});
}

TEST_F(IdxTest, UnknownTypeCode) {
  write_raw(dir_ / "t", concat(header(0x07, {2}), {1, 2}));
  expect_read_error(dir_ / "t", {"type code", "0x07"});
}

TEST_F(IdxTest, ZeroOrTooManyDimensions) {
  write_raw(dir_ / "zero", {0, 0, 8, 0, 1, 2, 3});
  expect_read_error(dir_ / "zero", {"dimension", "0 dimensions"});
  write_raw(dir_ / "five", concat(header(0x08, {1, 1, 1, 1, 1}), {7}));
  expect_read_error(dir_ / "five", {"dimension", "5 dimensions"});
}

TEST_F(IdxTest, ZeroSizedDimension) {
  write_raw(dir_ / "z", header(0x08, {3, 0}));
  expect_read_error(dir_ / "z", {"dimension 1", "zero"});
}

TEST_F(IdxTest, TruncatedHeader) {
  write_raw(dir_ / "h", {0, 0, 8, 3, 0, 0, 0, 5, 0});
  expect_read_error(dir_ / "h", {"truncated", "3 dimensions", "after 5"});
}

TEST_F(IdxTest, TruncatedDataPlainAndGzip) {
  const Bytes bytes = concat(header(0x08, {10, 10}), pattern(50));
  write_raw(dir_ / "plain", bytes);
  expect_read_error(dir_ / "plain", {"truncated", "promises 100 data bytes", "file holds 50"});
  write_gzip_raw(dir_ / "gz", bytes);
  expect_read_error(dir_ / "gz", {"truncated", "promises 100 data bytes", "decompressed stream holds 50"});
}

TEST_F(IdxTest, TrailingGarbagePlainAndGzip) {
  const Bytes bytes = concat(header(0x08, {4}), pattern(6));
  write_raw(dir_ / "plain", bytes);
  expect_read_error(dir_ / "plain", {"trailing", "2 bytes", "4 data bytes"});
  write_gzip_raw(dir_ / "gz", bytes);
  expect_read_error(dir_ / "gz", {"trailing", "2 bytes", "after decompression"});
}

TEST_F(IdxTest, GarbageAfterGzipStream) {
  write_idx(dir_ / "g.gz", 0x08, std::vector<std::int64_t>{4}, pattern(4), true);
  write_raw(dir_ / "g.gz", concat(read_raw(dir_ / "g.gz"), {0xde, 0xad, 0xbe, 0xef}));
  expect_read_error(dir_ / "g.gz", {"trailing", "gzip", "de ad be ef"});
}

TEST_F(IdxTest, CorruptGzipStream) {
  const fs::path p = dir_ / "c.gz";
  write_idx(p, 0x08, std::vector<std::int64_t>{50, 40}, pattern(2000), true);
  const Bytes good = read_raw(p);
  ASSERT_GT(good.size(), 40u);

  Bytes bad_crc = good;
  bad_crc[bad_crc.size() - 8] ^= 0xff;  // gzip trailer: CRC32, then ISIZE
  write_raw(p, bad_crc);
  expect_read_error(p, {"corrupt gzip"});

  Bytes bad_body = good;
  for (std::size_t i = 12; i < 28; ++i) bad_body[i] = 0xff;
  write_raw(p, bad_body);
  expect_read_error(p, {"corrupt gzip"});

  Bytes bad_header = good;
  bad_header[2] = 0x07;  // compression method must be 8 (deflate)
  write_raw(p, bad_header);
  expect_read_error(p, {"corrupt gzip"});
}

TEST_F(IdxTest, TruncatedGzipStream) {
  const fs::path p = dir_ / "t.gz";
  write_idx(p, 0x08, std::vector<std::int64_t>{50, 40}, pattern(2000), true);
  const Bytes good = read_raw(p);
  write_raw(p, Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2)));
  expect_read_error(p, {"truncated"});
  write_raw(p, Bytes(good.begin(), good.end() - 4));  // only the trailer cut
  expect_read_error(p, {"truncated gzip"});
}

TEST_F(IdxTest, HostileHeaderFailsFastWithoutAllocating) {
  const fs::path p = dir_ / "huge";
  write_raw(p, concat(header(0x08, {1u << 20, 1u << 20}), pattern(16)));  // 2^40 bytes
  largest_allocation = 0;
  expect_read_error(p, {"too large", "1048576 x 1048576", "4 GiB"});
  EXPECT_LT(largest_allocation.load(), std::size_t{1} << 20);

  // float64 elements: 2^30 x 8 bytes = 8 GiB, also over the cap.
  write_raw(p, concat(header(0x0E, {1u << 15, 1u << 15}), pattern(16)));
  expect_read_error(p, {"too large"});

  // Four dims of 2^32 - 1: a naive product would overflow 64 bits.
  write_raw(p, concat(header(0x08, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}), {}));
  expect_read_error(p, {"too large"});
}

TEST_F(IdxTest, HostileHeaderUnderCapStillBoundedByRealBytes) {
  // 3 GiB promised: under the cap, so only real bytes may bound memory.
  const Bytes bytes = concat(header(0x08, {3, 1u << 30}), pattern(100));
  write_raw(dir_ / "plain", bytes);
  write_gzip_raw(dir_ / "gz", bytes);
  largest_allocation = 0;
  expect_read_error(dir_ / "plain", {"truncated", "3221225472", "file holds 100"});
  expect_read_error(dir_ / "gz", {"truncated", "3221225472", "holds 100"});
  EXPECT_LT(largest_allocation.load(), std::size_t{4} << 20);
}

TEST_F(IdxTest, WriteRejectsBadArguments) {
  const fs::path p = dir_ / "w";
  const auto expect_invalid = [&](std::uint8_t type, std::vector<std::int64_t> dims, Bytes data,
                                  const std::string& word) {
    try {
      write_idx(p, type, dims, data, false);
      ADD_FAILURE() << "write_idx did not throw for " << word;
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find(word), std::string::npos) << msg;
    }
  };
  expect_invalid(0x08, {2, 3}, pattern(5), "need 6 data bytes but 5");
  expect_invalid(0x0B, {3}, pattern(3), "need 6 data bytes but 3");
  expect_invalid(0x0A, {3}, pattern(3), "type code");
  expect_invalid(0x08, {}, {}, "0 dimensions");
  expect_invalid(0x08, {1, 1, 1, 1, 1}, pattern(1), "5 dimensions");
  expect_invalid(0x08, {2, 0}, {}, "dimension 1 is 0");
  expect_invalid(0x08, {-1}, {}, "dimension 0 is -1");
  expect_invalid(0x08, {std::int64_t{1} << 32}, {}, "4294967296");
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(IdxTest, WriteToUnwritablePathIsIoError) {
  const fs::path p = dir_ / "no" / "such" / "dir" / "x";
  for (bool gzip : {false, true}) {
    try {
      write_idx(p, 0x08, std::vector<std::int64_t>{1}, pattern(1), gzip);
      ADD_FAILURE() << "write_idx did not throw";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cannot open for writing"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep::data
