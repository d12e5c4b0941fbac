// Reading and writing IDX files (the MNIST / Fashion-MNIST container format).
//
// An IDX file is a 4-byte magic `00 00 tt nn` (tt = element type code, nn =
// number of dimensions), then nn big-endian 32-bit dimension sizes, then the
// element data in row-major order, big-endian. Files may be gzip-compressed;
// read_idx detects that from the gzip magic bytes `1f 8b`, not from the name.
//
// Type codes and element sizes: 0x08 unsigned byte (1), 0x09 signed byte (1),
// 0x0B int16 (2), 0x0C int32 (4), 0x0D float32 (4), 0x0E float64 (8).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <functional>
#include <vector>

namespace lockstep::data {

// The largest data section read_idx accepts (4 GiB). A header promising more
// is rejected before anything is allocated.
inline constexpr std::uint64_t kMaxIdxDataBytes = std::uint64_t{4} << 30;

// The most dimensions an IDX header may declare.
inline constexpr int kMaxIdxDims = 4;

// One IDX file in memory. Owns its data.
struct IdxArray {
  std::uint8_t type_code = 0x08;
  // 1 to 4 sizes, each >= 1, outermost first.
  std::vector<std::int64_t> dims;
  // Raw element data exactly as stored in the file: row-major and, for
  // multi-byte types, big-endian. Size = product(dims) * element size.
  std::vector<std::uint8_t> bytes;
};

// Bytes per element for an IDX type code, or 0 if the code is not one of the
// six listed above.
std::size_t idx_element_size(std::uint8_t type_code);

// Reads a plain or gzip-compressed IDX file.
// Throws lockstep::IoError (message = path plus the defect) if the file is
// missing or unreadable, empty, has a bad magic / unknown type code, declares
// zero or more than 4 dimensions or a zero-sized dimension, promises more than
// kMaxIdxDataBytes, is truncated, has bytes after the data, or is a corrupt
// gzip stream. For gzip files, damage to the compressed stream is reported as
// such even when it first shows up as a bad IDX header or size. Memory use is
// bounded by the bytes actually present: a hostile header never causes a large
// allocation.
//
// `before_data`, if given, sees the header (type code and dims, no bytes yet)
// and the data's size before anything is read or allocated; what it throws
// goes to the caller (a budget for memory, say).
using IdxHeaderCheck = std::function<void(const IdxArray& header, std::uint64_t data_bytes)>;
IdxArray read_idx(const std::filesystem::path& path, const IdxHeaderCheck& before_data = {});

// Writes an IDX file (gzip-compressed if `gzip`), replacing any existing file.
// `bytes` is the raw big-endian element data, as in IdxArray::bytes.
// Throws lockstep::InvalidArgument if the type code is unknown, dims has 0 or
// more than 4 entries, a dim is outside [1, 2^32 - 1], or bytes.size() is not
// product(dims) * element size; lockstep::IoError if the file cannot be written.
void write_idx(const std::filesystem::path& path, std::uint8_t type_code, std::span<const std::int64_t> dims,
               std::span<const std::uint8_t> bytes, bool gzip);

}  // namespace lockstep::data
