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
#include <unordered_set>
#include <utility>

#include "lockstep/atomic_file.h"
#include "lockstep/error.h"

namespace lockstep::nn {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

static_assert(std::endian::native == std::endian::little, "tensor bytes are copied as they are");
constexpr const char* kMetadataKey = "__metadata__";
constexpr std::uint64_t kFloatBytes = sizeof(float);
constexpr std::size_t kMaxMetadataEntries = 1 << 16;  // real files have a handful
constexpr std::size_t kMaxListLength = 1024;          // far more dimensions than any tensor has

[[noreturn]] void fail(const fs::path& path, const std::string& defect) {
  throw IoError(path.string() + ": " + defect);
}

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

// A name as shown in messages: quoted, cut short if a hostile file made it huge.
std::string show(const std::string& name) {
  return "'" + (name.size() <= 80 ? name : name.substr(0, 80) + "...") + "'";
}

std::string list_text(const std::vector<std::uint64_t>& v) {
  std::string s = "[";  // appended, not "[" + s: GCC 12 warns (-Wrestrict) on that falsely
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(v[i]);
  }
  s += ']';
  return s;
}

// The product of non-negative dims (0 if any is 0), or nullopt if it overflows.
std::optional<std::uint64_t> element_count(const std::vector<std::int64_t>& shape) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::uint64_t n = 1;
  for (std::int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  return n;
}

struct Fd {  // owns a file descriptor
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
    throw InvalidArgument("safetensors: " + std::string(what) + " " + show(s) + " is not UTF-8.");
  }
}

// Validates all arguments and returns the header, padded so that 8 + size is a multiple of 8.
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
    const std::string who = "safetensors: tensor " + show(t.name);
    if (t.name == kMetadataKey) throw InvalidArgument(who + " uses the reserved name.");
    if (!seen.insert(t.name).second) throw InvalidArgument(who + " appears twice.");
    for (std::int64_t d : t.shape)
      if (d < 0) throw InvalidArgument(who + " has negative dimension " + std::to_string(d) + ".");
    const std::optional<std::uint64_t> count = element_count(t.shape);
    if (count != t.data.size())
      throw InvalidArgument(who + " has " + (count ? std::to_string(*count) : "too many") +
                            " elements in its shape but " + std::to_string(t.data.size()) + " values.");
    const std::uint64_t end = offset + *count * kFloatBytes;
    h += json_string(t.name, "tensor name") + ":{\"dtype\":\"F32\",\"shape\":[";
    for (std::int64_t d : t.shape) h += std::to_string(d) + ",";
    if (!t.shape.empty()) h.pop_back();
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]},";
    offset = end;
  }
  if (h.size() > 1) h.pop_back();  // the last comma
  h += "}";
  while ((8 + h.size()) % 8 != 0) h += ' ';
  return h;
}

// Reads exactly `size` bytes at `offset`; `what` names them if the file ends first.
void read_at(const fs::path& path, int fd, void* out, std::size_t size, std::uint64_t offset,
             const std::string& what) {
  for (char* p = static_cast<char*>(out); size > 0;) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "reading the file failed (" + errno_text(errno) + ").");
    if (n == 0) fail(path, "the file ended while reading " + what + ".");
    p += n;
    offset += static_cast<std::uint64_t>(n);
    size -= static_cast<std::size_t>(n);
  }
}

struct Entry {
  TensorData tensor;  // data is read once all entries are checked
  std::uint64_t begin = 0, end = 0;
};

// Turns the header's SAX events into entries, checking the layout as it goes, so a hostile
// header fails at its first defect and costs little more memory than the entries it declares.
// Depth: 1 inside the top object, 2 inside an entry, 3 inside a list such as "shape".
class HeaderReader {
 public:
  HeaderReader(const fs::path& path, std::uint64_t data_size, std::map<std::string, std::string>& metadata)
      : path_(path), data_size_(data_size), metadata_(metadata) {}
  std::vector<Entry> entries;  // in header order

  bool start_object(std::size_t) {
    if (depth_ >= 2) return misplaced("an object");
    if (depth_++ == 1) {  // a new entry
      fields_.clear();
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
      // JSON leaves duplicate keys open; the reference reader refuses them, and
      // here the last would win silently ("dtype": "BF16", ..., "dtype": "F32").
      if (!fields_.insert(k).second)
        fail(path_, (in_metadata() ? std::string("metadata") : "tensor " + show(top_key_)) + " lists " + show(k) +
                        " twice.");
    } else if (!names_.insert(top_key_ = k).second) {
      fail(path_, "header lists " + show(k) + " twice.");
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
    if (field_ == "shape") shape_ = std::move(numbers_);
    if (field_ == "data_offsets") offsets_ = std::move(numbers_);
    return true;
  }
  bool string(std::string& s) {
    if (depth_ == 2 && in_metadata()) {
      if (metadata_.size() >= kMaxMetadataEntries)
        fail(path_, "metadata has more than " + std::to_string(kMaxMetadataEntries) + " entries.");
      metadata_.insert_or_assign(field_, std::move(s));
    } else if (depth_ == 2 && field_ == "dtype") {
      dtype_ = std::move(s);
    } else {
      return misplaced("a string");
    }
    return true;
  }
  bool number_unsigned(std::uint64_t v) {
    if (depth_ != 3) return misplaced("a number");
    if (numbers_.size() >= kMaxListLength)
      bad("has more than " + std::to_string(kMaxListLength) + " numbers in its " + field_ + ".");
    numbers_.push_back(v);
    return true;
  }
  bool number_integer(std::int64_t v) {  // only negative integers come here
    return misplaced("negative number " + std::to_string(v));
  }
  bool number_float(double, const std::string&) { return misplaced("a non-integer number"); }
  bool boolean(bool) { return misplaced("a boolean"); }
  bool null() { return misplaced("null"); }
  bool binary(Json::binary_t&) { return misplaced("binary data"); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
    if (auto pos = what.find("] "); pos != std::string::npos) what.erase(0, pos + 2);
    fail(path_, "header is not valid JSON (" + what + ").");
  }

 private:
  bool in_metadata() const { return top_key_ == kMetadataKey; }
  [[noreturn]] void bad(const std::string& defect) const {
    fail(path_, "tensor " + show(top_key_) + " " + defect);
  }

  // A value where the layout has none. Scalars in unknown fields of an entry are ignored,
  // as the reference implementation does; everything else is an error.
  bool misplaced(const std::string& what) {
    if (depth_ == 0) fail(path_, "header is not a JSON object; the file is not safetensors.");
    if (depth_ == 1) fail(path_, "header entry " + show(top_key_) + " is " + what + ", not an object.");
    if (in_metadata()) fail(path_, "metadata value " + show(field_) + " is " + what + ", not a string.");
    const bool known = field_ == "dtype" || field_ == "shape" || field_ == "data_offsets";
    if (what == "an object" || what == "a list")
      bad("has " + what + " nested in its " + field_ + "; safetensors headers never nest so deep.");
    if (!known) return true;
    if (depth_ == 2) bad("has " + what + " as its " + field_ + ".");
    bad("has " + what + " in its " + field_ + "; only non-negative integers are allowed.");
  }

  void finish_entry() {
    if (!dtype_) bad("has no \"dtype\" field.");
    if (!shape_) bad("has no \"shape\" field.");
    if (!offsets_) bad("has no \"data_offsets\" field.");
    if (*dtype_ != "F32") bad("has dtype " + show(*dtype_) + "; only F32 is supported.");
    Entry e{{top_key_, {}, {}}};
    for (std::uint64_t d : *shape_) {
      if (d > INT64_MAX) bad("has dimension " + std::to_string(d) + ", which is too large.");
      e.tensor.shape.push_back(static_cast<std::int64_t>(d));
    }
    const std::string shape = list_text(*shape_), range = list_text(*offsets_);
    const std::optional<std::uint64_t> count = element_count(e.tensor.shape);
    if (!count || *count > data_size_ / kFloatBytes)
      bad("has shape " + shape + ", more values than the data section holds.");
    if (offsets_->size() != 2) bad("has data_offsets " + range + ", not a [begin, end] pair.");
    e.begin = (*offsets_)[0];
    e.end = (*offsets_)[1];
    if (e.end < e.begin) bad("has data_offsets " + range + " with end before begin.");
    if (e.end > data_size_)
      bad("has data_offsets " + range + " past the end of the data section (" + std::to_string(data_size_) +
          " bytes); the file is truncated or corrupt.");
    if (e.end - e.begin != *count * kFloatBytes)
      bad("has shape " + shape + " (" + std::to_string(*count * kFloatBytes) +
          " bytes of F32) but data_offsets " + range + " span " + std::to_string(e.end - e.begin) +
          " bytes.");
    entries.push_back(std::move(e));
  }

  const fs::path& path_;
  const std::uint64_t data_size_;
  std::map<std::string, std::string>& metadata_;
  int depth_ = 0;
  std::string top_key_, field_;
  std::unordered_set<std::string> names_;
  std::unordered_set<std::string> fields_;  // of the current entry (or of the metadata)
  std::optional<std::string> dtype_;
  std::optional<std::vector<std::uint64_t>> shape_, offsets_;
  std::vector<std::uint64_t> numbers_;
};

// Sorts entries by position (keeping header order for equal ones) and checks that they
// tile the data section exactly, as the format requires.
void check_coverage(const fs::path& path, std::vector<Entry>& entries, std::uint64_t data_size) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.begin < covered)
      fail(path, "tensors " + show(entries[i - 1].tensor.name) + " and " + show(e.tensor.name) +
                     " overlap in the data section.");
    if (e.begin > covered)
      fail(path, "bytes " + std::to_string(covered) + " to " + std::to_string(e.begin) +
                     " of the data section belong to no tensor; the format forbids gaps.");
    covered = e.end;
  }
  if (covered != data_size)
    fail(path, "the last " + std::to_string(data_size - covered) + " bytes of the data section " +
                   "belong to no tensor; the format forbids unused bytes.");
}

}  // namespace

void save_safetensors(const fs::path& path, std::span<const TensorRef> tensors,
                      const std::map<std::string, std::string>& metadata, std::string_view what) {
  const std::string header = build_header(tensors, metadata);  // all validation happens here
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header.size() >> (8 * i));

  std::vector<std::span<const std::byte>> pieces = {std::as_bytes(std::span(length)),
                                                     std::as_bytes(std::span(header))};
  for (const TensorRef& t : tensors) pieces.push_back(std::as_bytes(t.data));
  write_file_atomically(path, pieces, what);
}

SafetensorsFile load_safetensors(const fs::path& path) {
  // O_NONBLOCK: a FIFO without a writer opens at once (and is refused below)
  // instead of blocking for good; reads of a regular file ignore it.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.fd < 0) fail(path, "cannot open the file (" + errno_text(errno) + ").");
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail(path, "cannot stat the file (" + errno_text(errno) + ").");
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file (a directory, FIFO, device or socket); give a safetensors file.");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  const std::string not_st = "; the file is not a safetensors file or is truncated.";
  // A pseudo-file (/proc, /sys) has a stat size of 0 and content that reads:
  // its length is not what the header's offsets are checked against.
  unsigned char probe = 0;
  if (file_size < 8 && ::pread(fd.fd, &probe, 1, static_cast<off_t>(file_size)) == 1)
    fail(path, "its size is not known before reading it (a /proc or /sys pseudo-file); give a safetensors file.");
  if (file_size < 8)
    fail(path, "the file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte " +
                   "header length" + not_st);

  unsigned char length[8];
  read_at(path, fd.fd, length, 8, 0, "the header length");
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length[i];
  if (header_size > file_size - 8)
    fail(path, "header length " + std::to_string(header_size) + " is larger than the file (" +
                   std::to_string(file_size) + " bytes)" + not_st);
  if (header_size > kMaxSafetensorsHeaderBytes)
    fail(path, "header length " + std::to_string(header_size) +
                   " exceeds the 100 MiB limit; the file is not a safetensors file.");
  const std::uint64_t data_start = 8 + header_size;

  SafetensorsFile out;
  std::vector<Entry> entries;
  {
    std::string text(header_size, '\0');
    read_at(path, fd.fd, text.data(), text.size(), 8, "the header");
    HeaderReader reader(path, file_size - data_start, out.metadata);
    Json::sax_parse(text, &reader);
    entries = std::move(reader.entries);
  }
  check_coverage(path, entries, file_size - data_start);
  out.tensors.reserve(entries.size());
  for (Entry& e : entries) {  // the entries tile the data section: no more than the file
    e.tensor.data.resize((e.end - e.begin) / kFloatBytes);
    read_at(path, fd.fd, e.tensor.data.data(), e.end - e.begin, data_start + e.begin,
            "tensor " + show(e.tensor.name));
    out.tensors.push_back(std::move(e.tensor));
  }
  return out;
}

}  // namespace lockstep::nn
