#include "lockstep/nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "lockstep/error.h"

namespace lockstep::nn {
namespace {

// Tensor data is written and read with plain memcpy semantics.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

namespace fs = std::filesystem;
using Json = nlohmann::json;
constexpr const char* kMetadataKey = "__metadata__";
constexpr std::uint64_t kFloatBytes = sizeof(float);

[[noreturn]] void fail(const fs::path& path, const std::string& defect) {
  throw IoError(path.string() + ": " + defect);
}

std::string errno_text(int err) { return std::generic_category().message(err); }

// A tensor name as shown in messages: quoted, cut short if a hostile file made it huge.
std::string show(const std::string& name) {
  constexpr std::size_t kMax = 80;
  return "'" + (name.size() <= kMax ? name : name.substr(0, kMax) + "...") + "'";
}

// Owns a file descriptor.
struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { close(); }
  int close() { return fd >= 0 ? ::close(std::exchange(fd, -1)) : 0; }
};

std::string json_string(const std::string& s, const char* what) {
  try {
    return Json(s).dump();
  } catch (const Json::type_error&) {
    throw InvalidArgument("safetensors: " + std::string(what) + " " + show(s) +
                          " is not valid UTF-8.");
  }
}

// The product of non-negative dims (0 if any is 0), or nullopt if it overflows.
std::optional<std::uint64_t> element_count(const std::vector<std::int64_t>& shape) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::uint64_t n = 1;
  for (std::int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  return n;
}

std::uint64_t checked_count(const TensorRef& t) {
  for (std::int64_t d : t.shape)
    if (d < 0)
      throw InvalidArgument("safetensors: tensor " + show(t.name) + " has negative dimension " +
                            std::to_string(d) + ".");
  const std::optional<std::uint64_t> count = element_count(t.shape);
  if (count != t.data.size())
    throw InvalidArgument("safetensors: tensor " + show(t.name) + " has " +
                          (count ? std::to_string(*count) : "too many") +
                          " elements in its shape but " + std::to_string(t.data.size()) +
                          " values.");
  return *count;
}

// Validates everything and returns the header JSON, padded so 8 + size is a multiple of 8.
std::string build_header(std::span<const TensorRef> tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += std::string("\"") + kMetadataKey + "\":{";
    for (const auto& [k, v] : metadata)
      h += json_string(k, "metadata key") + ":" + json_string(v, "metadata value") + ",";
    h.back() = '}';
    h += ",";
  }
  std::unordered_set<std::string_view> seen;
  std::uint64_t offset = 0;
  for (const TensorRef& t : tensors) {
    if (t.name == kMetadataKey)
      throw InvalidArgument("safetensors: \"__metadata__\" is reserved and cannot name a tensor.");
    if (!seen.insert(t.name).second)
      throw InvalidArgument("safetensors: two tensors are named " + show(t.name) + ".");
    const std::uint64_t end = offset + checked_count(t) * kFloatBytes;
    h += json_string(t.name, "tensor name") + ":{\"dtype\":\"F32\",\"shape\":[";
    for (std::int64_t d : t.shape) h += std::to_string(d) + ",";
    if (!t.shape.empty()) h.pop_back();
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]},";
    offset = end;
  }
  if (h.size() > 1) h.pop_back();  // trailing comma
  h += "}";
  while ((8 + h.size()) % 8 != 0) h += ' ';
  return h;
}

void write_all(const fs::path& path, int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail(path, "writing the temporary file failed (" + errno_text(n < 0 ? errno : EIO) + ").");
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Removes the temporary file unless the rename went through.
struct TmpFileGuard {
  fs::path path;
  bool committed = false;
  ~TmpFileGuard() {
    if (!committed) ::unlink(path.c_str());
  }
};

struct Entry {
  std::string name;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0, count = 0;
  std::size_t order = 0;  // position in the header
};

// Turns the header's SAX events into entries, checking the layout as it goes: a hostile
// header fails at its first defect and costs no more memory than the entries it declares.
// Nesting deeper than a safetensors header has (object > entry > list > number) is rejected.
class HeaderReader {
 public:
  HeaderReader(const fs::path& path, std::uint64_t data_size,
               std::map<std::string, std::string>& metadata)
      : path_(path), data_size_(data_size), metadata_(metadata) {}
  std::vector<Entry> entries;

  bool start_object(std::size_t) {
    if (depth_ >= 2) return misplaced("an object");
    if (depth_++ == 1) {
      dtype_.reset();
      shape_.reset();
      offsets_.reset();
    }
    return true;
  }
  bool end_object() {
    if (--depth_ == 1 && !in_metadata()) finish_entry();
    return true;
  }
  bool key(std::string& k) {
    if (depth_ == 2) {
      field_ = k;
    } else {
      if (!names_.insert(k).second) fail(path_, "header lists " + show(k) + " twice.");
      top_key_ = k;
    }
    return true;
  }
  bool start_array(std::size_t) {
    if (depth_ != 2 || in_metadata()) return misplaced("a list");
    numbers_.clear();
    ++depth_;
    return true;
  }
  bool end_array() {
    --depth_;
    if (field_ == "shape") shape_ = numbers_;
    if (field_ == "data_offsets") offsets_ = numbers_;
    return true;
  }
  bool string(std::string& s) {
    if (depth_ == 2 && in_metadata()) {
      if (metadata_.size() >= kMaxMetadataEntries)
        fail(path_, "metadata has more than " + std::to_string(kMaxMetadataEntries) + " entries.");
      metadata_.insert_or_assign(field_, s);
      return true;
    }
    if (depth_ != 2 || field_ != "dtype") return misplaced("a string");
    dtype_ = s;
    return true;
  }
  bool number_unsigned(std::uint64_t v) {
    if (depth_ != 3) return misplaced("a number");
    numbers_.push_back(v);
    return true;
  }
  bool number_integer(std::int64_t v) {  // only negative integers arrive here
    return misplaced("a negative number (" + std::to_string(v) + ")");
  }
  bool number_float(double, const std::string&) { return misplaced("a non-integer number"); }
  bool boolean(bool) { return misplaced("a boolean"); }
  bool null() { return misplaced("null"); }
  bool binary(Json::binary_t&) { return misplaced("binary data"); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    fail(path_, "header is not valid JSON (" + what + ").");
  }

 private:
  static constexpr std::size_t kMaxMetadataEntries = 1 << 16;
  bool in_metadata() const { return top_key_ == kMetadataKey; }
  bool known_field() const {
    return field_ == "dtype" || field_ == "shape" || field_ == "data_offsets";
  }
  std::string who() const { return "tensor " + show(top_key_); }

  // A value where the layout does not allow it: ignored in unknown fields of a tensor
  // entry (as the reference implementation does), an error everywhere else.
  bool misplaced(const std::string& what) {
    if (depth_ == 0)
      fail(path_, "header is not a JSON object; the file is not a safetensors file.");
    if (depth_ == 1)
      fail(path_, "header entry " + show(top_key_) + " is " + what + ", not an object.");
    if (in_metadata())
      fail(path_, "metadata value for " + show(field_) + " is " + what + ", not a string.");
    const bool container = what == "an object" || what == "a list";
    if (!container && !known_field()) return true;
    const std::string field = "\"" + field_ + "\"";
    if (container)
      fail(path_, who() + " has " + what + (depth_ == 2 ? " as its " : " inside its ") + field +
                      " field; a safetensors header never nests this deep.");
    if (depth_ == 2) fail(path_, who() + " has " + what + " as its " + field + ".");
    fail(path_,
         who() + " has " + what + " in its " + field + "; only non-negative integers are allowed.");
  }

  void finish_entry() {
    for (const auto& [present, field] :
         {std::pair{dtype_.has_value(), "dtype"}, std::pair{shape_.has_value(), "shape"},
          std::pair{offsets_.has_value(), "data_offsets"}})
      if (!present) fail(path_, who() + " has no \"" + field + "\" field.");
    if (*dtype_ != "F32")
      fail(path_, who() + " has dtype " + show(*dtype_) + "; only F32 is supported.");
    Entry e{top_key_, {}};
    e.order = entries.size();
    for (std::uint64_t d : *shape_) {
      if (d > INT64_MAX)
        fail(path_, who() + " has dimension " + std::to_string(d) + ", which is too large.");
      e.shape.push_back(static_cast<std::int64_t>(d));
    }
    const std::string shape = "[" + join(*shape_) + "]", range = "[" + join(*offsets_) + "]";
    const std::optional<std::uint64_t> count = element_count(e.shape);
    e.count = count.value_or(0);
    if (!count || e.count > data_size_ / kFloatBytes)
      fail(path_, who() + " has shape " + shape + ", more values than the data section (" +
                      std::to_string(data_size_) + " bytes) holds.");
    if (offsets_->size() != 2)
      fail(path_, who() + " has data_offsets " + range + ", not a [begin, end] pair.");
    e.begin = (*offsets_)[0];
    e.end = (*offsets_)[1];
    if (e.end < e.begin)
      fail(path_, who() + " has data_offsets " + range + " with end before begin.");
    if (e.end > data_size_)
      fail(path_, who() + " has data_offsets " + range + " past the end of the data section (" +
                      std::to_string(data_size_) + " bytes); the file is truncated or corrupt.");
    if (e.end - e.begin != e.count * kFloatBytes)
      fail(path_, who() + " has shape " + shape + " (" + std::to_string(e.count * kFloatBytes) +
                      " bytes of F32) but data_offsets " + range + " span " +
                      std::to_string(e.end - e.begin) + " bytes.");
    entries.push_back(std::move(e));
  }

  static std::string join(const std::vector<std::uint64_t>& v) {
    std::string s;
    for (std::uint64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
  }

  const fs::path& path_;
  const std::uint64_t data_size_;
  std::map<std::string, std::string>& metadata_;
  int depth_ = 0;
  std::string top_key_, field_;
  std::unordered_set<std::string> names_;
  std::optional<std::string> dtype_;
  std::optional<std::vector<std::uint64_t>> shape_, offsets_;
  std::vector<std::uint64_t> numbers_;
};

// Reads exactly `size` bytes at `offset`; `what` names them if the file ends first.
void read_at(const fs::path& path, int fd, void* out, std::size_t size, std::uint64_t offset,
             const std::string& what) {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "read failed (" + errno_text(errno) + ").");
    if (n == 0) fail(path, "the file ended while reading " + what + ".");
    p += n;
    offset += static_cast<std::uint64_t>(n);
    size -= static_cast<std::size_t>(n);
  }
}

// Reads and checks the length prefix and header; returns the tensor entries (in header
// order) and fills `metadata` and `data_start` (file offset of the data section).
std::vector<Entry> read_header(const fs::path& path, int fd, std::uint64_t file_size,
                               std::uint64_t& data_start,
                               std::map<std::string, std::string>& metadata) {
  const std::string not_st = "; the file is not a safetensors file or is truncated.";
  if (file_size < 8)
    fail(path, "the file is " + std::to_string(file_size) +
                   " bytes, too short for the 8-byte header length" + not_st);
  unsigned char length[8];
  read_at(path, fd, length, 8, 0, "the header length");
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length[i];
  if (header_size > file_size - 8)
    fail(path, "header length " + std::to_string(header_size) + " is larger than the file (" +
                   std::to_string(file_size) + " bytes)" + not_st);
  if (header_size > kMaxSafetensorsHeaderBytes)
    fail(path, "header length " + std::to_string(header_size) +
                   " exceeds the 100 MiB limit; the file is not a safetensors file.");
  std::string text(header_size, '\0');
  read_at(path, fd, text.data(), text.size(), 8, "the header");
  data_start = 8 + header_size;

  HeaderReader reader(path, file_size - data_start, metadata);
  Json::sax_parse(text, &reader);
  return std::move(reader.entries);
}

// Sorts entries by position and checks they tile the data section exactly.
void check_coverage(const fs::path& path, std::vector<Entry>& entries, std::uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.order) < std::tie(b.begin, b.end, b.order);
  });
  std::uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered)
      fail(path, "tensors " + show(previous->name) + " and " + show(e.name) +
                     " overlap in the data section.");
    if (e.begin > covered)
      fail(path, "bytes " + std::to_string(covered) + " to " + std::to_string(e.begin) +
                     " of the data section belong to no tensor; the spec requires full coverage.");
    covered = e.end;
    previous = &e;
  }
  if (covered != data_size)
    fail(path, "the last " + std::to_string(data_size - covered) + " of the " +
                   std::to_string(data_size) +
                   " data bytes belong to no tensor; the spec requires full coverage.");
}

}  // namespace

void save_safetensors(const fs::path& path, std::span<const TensorRef> tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string header = build_header(tensors, metadata);  // all validation happens here
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header.size() >> (8 * i));

  const std::size_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
  TmpFileGuard tmp{fs::path(path) +=
                   ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(thread)};
  Fd fd(::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (const int err = errno; fd.fd < 0)
    fail(path, "cannot create the temporary file " + tmp.path.filename().string() + " (" +
                   errno_text(err) + "); nothing was written.");
  write_all(path, fd.fd, length, sizeof(length));
  write_all(path, fd.fd, header.data(), header.size());
  for (const TensorRef& t : tensors) write_all(path, fd.fd, t.data.data(), t.data.size_bytes());
  if (::fsync(fd.fd) != 0 || fd.close() != 0)
    fail(path, "flushing the temporary file failed (" + errno_text(errno) + ").");
  std::error_code ec;
  fs::rename(tmp.path, path, ec);
  if (ec)
    fail(path, "cannot replace the file with the finished temporary file (" + ec.message() + ").");
  tmp.committed = true;
}

SafetensorsFile load_safetensors(const fs::path& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.fd < 0) fail(path, "cannot open the file (" + errno_text(errno) + ").");
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail(path, "cannot stat the file (" + errno_text(errno) + ").");
  if (!S_ISREG(st.st_mode)) fail(path, "the path is not a regular file.");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);

  SafetensorsFile out;
  std::uint64_t data_start = 0;
  std::vector<Entry> entries = read_header(path, fd.fd, file_size, data_start, out.metadata);
  check_coverage(path, entries, file_size - data_start);
  out.tensors.reserve(entries.size());
  for (Entry& e : entries) {
    TensorData t{std::move(e.name), std::move(e.shape), std::vector<float>(e.count)};
    read_at(path, fd.fd, t.data.data(), e.end - e.begin, data_start + e.begin,
            "tensor " + show(t.name));
    out.tensors.push_back(std::move(t));
  }
  return out;
}

}  // namespace lockstep::nn
