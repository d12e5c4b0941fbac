#include "lockstep/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "lockstep/error.h"

namespace lockstep::data {

std::size_t idx_element_size(std::uint8_t type_code) {
  switch (type_code) {
    case 0x08:
      return 1;
    case 0x09:
      return 1;
    case 0x0B:
      return 2;
    case 0x0C:
      return 4;
    case 0x0D:
      return 4;
    case 0x0E:
      return 8;
    default:
      return 0;
  }
}

namespace {

namespace fs = std::filesystem;

constexpr std::size_t kInputBufferBytes = std::size_t{1} << 16;
// Unknown-size (gzip) data grows from this chunk, so memory follows real bytes.
constexpr std::uint64_t kFirstDataChunk = std::uint64_t{1} << 20;
// Trailing garbage is counted up to this many bytes, then reported as "more than".
constexpr std::uint64_t kMaxTrailingCount = std::uint64_t{64} << 20;
// After an IDX-level error in a gzip file, at most this much more is
// decompressed to look for gzip damage that would explain it.
constexpr std::uint64_t kMaxDrainBytes = kMaxIdxDataBytes;
// Largest single zlib call (its lengths are 32-bit).
constexpr std::size_t kMaxZlibChunk = std::size_t{1} << 30;

[[noreturn]] void fail(const fs::path& path, const std::string& defect) {
  throw IoError(path.string() + ": " + defect);
}

std::string hex_bytes(const std::uint8_t* b, std::size_t n) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) s += ' ';
    s += kDigits[b[i] >> 4];
    s += kDigits[b[i] & 15];
  }
  return s;
}

std::string hex_byte(std::uint8_t b) {
  return "0x" + hex_bytes(&b, 1);
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// A byte stream over a plain or gzip-compressed file (gzip detected by the
// magic 1f 8b; concatenated gzip members are read as one stream). read()
// returns fewer bytes than asked only at the end of the stream. Every problem
// is thrown as IoError naming the file.
class ByteSource {
 public:
  explicit ByteSource(const fs::path& path) : path_(path), in_(kInputBufferBytes) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (st.type() == fs::file_type::not_found) fail(path, "no such file");
    if (ec) fail(path, "cannot access: " + ec.message());
    if (fs::is_directory(st)) fail(path, "is a directory, not an IDX file");
    // A FIFO without a writer would block the open for good; a device or a
    // socket is no data set either.
    if (!fs::is_regular_file(st)) fail(path, "is not a regular file (a FIFO, device or socket); give the IDX file itself");
    file_.reset(std::fopen(path.c_str(), "rb"));
    if (!file_) fail(path, std::string("cannot open: ") + std::strerror(errno));
    fill();
    gzip_ = in_len_ >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
    if (gzip_) {
      if (inflateInit2(&strm_, 15 + 16) != Z_OK) fail(path, "cannot start gzip decompression");
      inflating_ = true;
    } else {
      const std::uintmax_t size = fs::file_size(path, ec);
      if (!ec) plain_size_ = size;
    }
  }
  ~ByteSource() {
    if (inflating_) inflateEnd(&strm_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  bool gzip() const { return gzip_; }
  // Total size of a plain file; empty for gzip (only regular files are opened).
  std::optional<std::uint64_t> plain_size() const { return plain_size_; }
  const char* stream_name() const { return gzip_ ? "the decompressed stream" : "the file"; }

  std::size_t read(std::uint8_t* dst, std::size_t n) {
    return gzip_ ? read_gzip(dst, n) : read_plain(dst, n);
  }

  // True once read() has thrown (the stream itself is damaged or unreadable).
  bool failed() const { return failed_; }

  // Decompresses and discards up to `limit` more bytes, so that damage to the
  // gzip stream (bad CRC, invalid data) is thrown as such.
  void drain(std::uint64_t limit) {
    std::vector<std::uint8_t> sink(kInputBufferBytes);
    for (std::uint64_t seen = 0; seen < limit;) {
      const std::size_t k = read(sink.data(), sink.size());
      seen += k;
      if (k < sink.size()) return;
    }
  }

 private:
  [[noreturn]] void stream_fail(const std::string& defect) {
    failed_ = true;
    fail(path_, defect);
  }

  // Moves unread input to the front of in_ and tops it up from the file.
  std::size_t fill() {
    const std::size_t left = in_len_ - in_pos_;
    std::memmove(in_.data(), in_.data() + in_pos_, left);
    in_pos_ = 0;
    in_len_ = left;
    const std::size_t k = std::fread(in_.data() + in_len_, 1, in_.size() - in_len_, file_.get());
    if (std::ferror(file_.get())) stream_fail(std::string("read error: ") + std::strerror(errno));
    in_len_ += k;
    return k;
  }

  std::size_t read_plain(std::uint8_t* dst, std::size_t n) {
    std::size_t got = std::min(n, in_len_ - in_pos_);
    std::memcpy(dst, in_.data() + in_pos_, got);
    in_pos_ += got;
    while (got < n) {
      const std::size_t k = std::fread(dst + got, 1, n - got, file_.get());
      if (std::ferror(file_.get())) stream_fail(std::string("read error: ") + std::strerror(errno));
      if (k == 0) break;
      got += k;
    }
    return got;
  }

  std::size_t read_gzip(std::uint8_t* dst, std::size_t n) {
    std::size_t got = 0;
    while (got < n && !stream_done_) {
      const bool at_eof = in_pos_ == in_len_ && fill() == 0;
      const std::size_t want = std::min(n - got, kMaxZlibChunk);
      strm_.next_in = in_.data() + in_pos_;
      strm_.avail_in = static_cast<uInt>(in_len_ - in_pos_);
      strm_.next_out = dst + got;
      strm_.avail_out = static_cast<uInt>(want);
      const int rc = inflate(&strm_, Z_NO_FLUSH);
      in_pos_ = in_len_ - strm_.avail_in;
      got += want - strm_.avail_out;
      if (rc == Z_STREAM_END) {
        end_member();
      } else if (rc == Z_BUF_ERROR && at_eof) {
        stream_fail(
            "truncated gzip stream: the compressed data ends before the gzip "
            "end-of-stream marker");
      } else if (rc != Z_OK) {
        stream_fail(std::string("corrupt gzip stream (zlib: ") +
                    (strm_.msg ? strm_.msg : "error " + std::to_string(rc)) + ")");
      }
    }
    return got;
  }

  // Called when a gzip member ended (its CRC verified): either the file ends
  // here, or another gzip member follows; anything else is garbage.
  void end_member() {
    if (in_len_ - in_pos_ < 2) fill();
    const std::size_t left = in_len_ - in_pos_;
    if (left == 0) {
      stream_done_ = true;
    } else if (left >= 2 && in_[in_pos_] == 0x1f && in_[in_pos_ + 1] == 0x8b) {
      inflateReset(&strm_);
    } else {
      stream_fail("trailing garbage after the end of the gzip stream (bytes " +
                  hex_bytes(in_.data() + in_pos_, std::min<std::size_t>(left, 4)) + " ...)");
    }
  }

  fs::path path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::vector<std::uint8_t> in_;
  std::size_t in_pos_ = 0;
  std::size_t in_len_ = 0;
  bool gzip_ = false;
  bool inflating_ = false;
  bool stream_done_ = false;
  bool failed_ = false;
  z_stream strm_{};
  std::optional<std::uint64_t> plain_size_;
};

// Reads exactly `data_bytes`, growing the buffer only as bytes arrive unless
// the plain file size already proved they are all there.
std::vector<std::uint8_t> read_data(ByteSource& src, const fs::path& path, std::uint64_t data_bytes) {
  std::vector<std::uint8_t> bytes;
  std::uint64_t filled = 0;
  while (filled < data_bytes) {
    const std::uint64_t target =
        src.plain_size() ? data_bytes : std::min(data_bytes, std::max(kFirstDataChunk, filled * 2));
    bytes.resize(target);
    const std::size_t want = target - filled;
    const std::size_t got = src.read(bytes.data() + filled, want);
    filled += got;
    if (got < want) {
      fail(path, "truncated: header promises " + std::to_string(data_bytes) + " data bytes but " +
                     src.stream_name() + " holds " + std::to_string(filled));
    }
  }
  return bytes;
}

void check_no_trailing(ByteSource& src, const fs::path& path, std::uint64_t data_bytes) {
  std::array<std::uint8_t, 4096> probe{};
  std::uint64_t extra = 0;
  while (extra <= kMaxTrailingCount) {
    const std::size_t k = src.read(probe.data(), probe.size());
    extra += k;
    if (k < probe.size()) break;
  }
  if (extra == 0) return;
  const std::string amount =
      extra > kMaxTrailingCount ? "more than 64 MiB" : std::to_string(extra) + " bytes";
  fail(path, "trailing garbage: " + amount + " after the " + std::to_string(data_bytes) +
                 " data bytes the header promises" + (src.gzip() ? " (after decompression)" : ""));
}

// Parses header and data from `src`, throwing IoError on any IDX-level defect.
IdxArray parse_idx(ByteSource& src, const fs::path& path, const IdxHeaderCheck& before_data) {
  std::array<std::uint8_t, 4> magic{};
  const std::size_t got_magic = src.read(magic.data(), magic.size());
  if (got_magic == 0) {
    fail(path, src.gzip() ? "empty: the gzip stream decompresses to 0 bytes" : "empty file (0 bytes)");
  }
  if (got_magic < magic.size()) {
    fail(path, std::string("truncated: ") + src.stream_name() + " holds only " + std::to_string(got_magic) +
                   " bytes, too short for the 4-byte IDX magic");
  }
  const std::string magic_hex = hex_bytes(magic.data(), magic.size());
  const std::string after = src.gzip() ? " after decompression" : "";
  if (magic[0] != 0 || magic[1] != 0) {
    fail(path, "not an IDX file (magic bytes " + magic_hex + after + " are not 00 00 tt nn)");
  }
  const std::uint8_t type_code = magic[2];
  const std::size_t element_size = idx_element_size(type_code);
  if (element_size == 0) {
    fail(path, "unknown IDX type code " + hex_byte(type_code) + " in magic bytes " + magic_hex + after +
                   " (expected 08, 09, 0b, 0c, 0d or 0e)");
  }
  const int ndims = magic[3];
  if (ndims == 0 || ndims > kMaxIdxDims) {
    fail(path, "bad dimension count: magic bytes " + magic_hex + after + " declare " + std::to_string(ndims) +
                   " dimensions; IDX files here have 1 to 4");
  }

  std::array<std::uint8_t, 4 * kMaxIdxDims> raw_dims{};
  const std::size_t dim_bytes = 4 * static_cast<std::size_t>(ndims);
  const std::size_t got_dims = src.read(raw_dims.data(), dim_bytes);
  if (got_dims < dim_bytes) {
    fail(path, "truncated: the header declares " + std::to_string(ndims) + " dimensions (" +
                   std::to_string(dim_bytes) + " bytes of sizes) but " + src.stream_name() + " ends after " +
                   std::to_string(got_dims) + " of them");
  }

  IdxArray out;
  out.type_code = type_code;
  std::uint64_t elements = 1;
  bool too_large = false;
  std::string shape;
  for (int i = 0; i < ndims; ++i) {
    const std::uint8_t* b = raw_dims.data() + 4 * i;
    const std::uint64_t d = (std::uint64_t{b[0]} << 24) | (std::uint64_t{b[1]} << 16) |
                            (std::uint64_t{b[2]} << 8) | std::uint64_t{b[3]};
    if (d == 0) {
      fail(path, "dimension " + std::to_string(i) + " of " + std::to_string(ndims) +
                     " is zero; every IDX dimension must be at least 1");
    }
    out.dims.push_back(static_cast<std::int64_t>(d));
    shape += (i > 0 ? " x " : "") + std::to_string(d);
    if (elements > kMaxIdxDataBytes / d) too_large = true;
    if (!too_large) elements *= d;
  }
  if (too_large || elements * element_size > kMaxIdxDataBytes) {
    fail(path, "too large: header promises " + shape + " elements of " + std::to_string(element_size) +
                   " byte(s), more than the 4 GiB limit "
                   "(corrupt or hostile header)");
  }
  const std::uint64_t data_bytes = elements * element_size;

  if (const auto size = src.plain_size()) {
    const std::uint64_t header_bytes = 4 + dim_bytes;
    const std::uint64_t holds = *size > header_bytes ? *size - header_bytes : 0;
    if (holds < data_bytes) {
      fail(path, "truncated: header promises " + std::to_string(data_bytes) +
                     " data bytes but the file holds " + std::to_string(holds));
    }
    if (holds > data_bytes) {
      fail(path, "trailing garbage: " + std::to_string(holds - data_bytes) + " bytes after the " +
                     std::to_string(data_bytes) + " data bytes the header promises");
    }
  }
  if (before_data) before_data(out, data_bytes);
  out.bytes = read_data(src, path, data_bytes);
  check_no_trailing(src, path, data_bytes);
  return out;
}

}  // namespace

IdxArray read_idx(const std::filesystem::path& path, const IdxHeaderCheck& before_data) {
  ByteSource src(path);
  try {
    return parse_idx(src, path, before_data);
  } catch (const IoError&) {
    // A damaged gzip stream can surface first as a bad IDX header or size;
    // report the root cause if the rest of the stream shows it.
    if (src.gzip() && !src.failed()) src.drain(kMaxDrainBytes);
    throw;
  }
}

void write_idx(const std::filesystem::path& path, std::uint8_t type_code, std::span<const std::int64_t> dims,
               std::span<const std::uint8_t> bytes, bool gzip) {
  const auto bad = [&](const std::string& defect) {
    throw InvalidArgument(path.string() + ": cannot write IDX: " + defect);
  };
  const std::size_t element_size = idx_element_size(type_code);
  if (element_size == 0) bad("unknown type code " + hex_byte(type_code));
  if (dims.empty() || dims.size() > static_cast<std::size_t>(kMaxIdxDims)) {
    bad(std::to_string(dims.size()) + " dimensions given; IDX files here have 1 to 4");
  }
  std::vector<std::uint8_t> header = {0, 0, type_code, static_cast<std::uint8_t>(dims.size())};
  std::uint64_t expected = element_size;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const std::int64_t d = dims[i];
    if (d < 1 || d > std::int64_t{0xFFFFFFFF}) {
      bad("dimension " + std::to_string(i) + " is " + std::to_string(d) + "; it must be in [1, 4294967295]");
    }
    const auto u = static_cast<std::uint64_t>(d);
    if (expected > std::numeric_limits<std::uint64_t>::max() / u) bad("dimensions overflow 64 bits");
    expected *= u;
    for (int shift = 24; shift >= 0; shift -= 8) header.push_back(static_cast<std::uint8_t>(u >> shift));
  }
  if (expected != bytes.size()) {
    bad("the dimensions need " + std::to_string(expected) + " data bytes but " +
        std::to_string(bytes.size()) + " were given");
  }

  if (gzip) {
    gzFile gz = gzopen(path.c_str(), "wb");
    if (!gz) fail(path, std::string("cannot open for writing: ") + std::strerror(errno));
    bool ok = gzwrite(gz, header.data(), static_cast<unsigned>(header.size())) > 0;
    for (std::size_t off = 0; ok && off < bytes.size(); off += kMaxZlibChunk) {
      const std::size_t n = std::min(kMaxZlibChunk, bytes.size() - off);
      ok = gzwrite(gz, bytes.data() + off, static_cast<unsigned>(n)) > 0;
    }
    const bool closed = gzclose(gz) == Z_OK;
    if (!ok || !closed) fail(path, "write failed while writing gzip data");
    return;
  }
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) fail(path, std::string("cannot open for writing: ") + std::strerror(errno));
  const bool ok = std::fwrite(header.data(), 1, header.size(), f.get()) == header.size() &&
                  std::fwrite(bytes.data(), 1, bytes.size(), f.get()) == bytes.size();
  if (!ok || std::fclose(f.release()) != 0) {
    fail(path, std::string("write failed: ") + std::strerror(errno));
  }
}

}  // namespace lockstep::data
