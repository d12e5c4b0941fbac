// Reading and writing float32 tensors in the safetensors format.
//
// File layout (https://github.com/huggingface/safetensors):
//   8 bytes   little-endian unsigned header length N
//   N bytes   UTF-8 JSON object: tensor name -> {"dtype", "shape", "data_offsets"},
//             plus an optional "__metadata__" object of string -> string
//   rest      the data section: every tensor's bytes, little-endian, row-major;
//             data_offsets [begin, end) are relative to the start of this section
//
// Files written here load unchanged in Python's safetensors and PyTorch. Only
// dtype F32 is supported in either direction.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::nn {

// A tensor to be saved; `data` is borrowed and must outlive the call.
struct TensorRef {
  std::string name;
  std::vector<std::int64_t> shape;
  std::span<const float> data;
};

// A tensor read from a file; owns its values.
struct TensorData {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

struct SafetensorsFile {
  // Sorted by position in the data section; tensors at the same position (only
  // possible for empty ones) keep their order in the header.
  std::vector<TensorData> tensors;
  std::map<std::string, std::string> metadata;  // the "__metadata__" object, if any
};

// Headers larger than this are rejected as hostile (the reference implementation
// has a limit of about the same size; real headers are far smaller).
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// Writes `tensors` as F32, their data laid out in the given order, the header
// padded with spaces so the data section starts 8-byte aligned. `metadata` is
// written as "__metadata__" when non-empty.
//
// Atomic (lockstep/atomic_file.h): writes a new temporary file beside `path`,
// fsyncs it, then renames it over `path`; on any failure `path` is untouched
// and no temporary file is left, even by a process killed while it writes.
//
// Throws InvalidArgument (before touching the disk) if a shape has a negative
// dimension or its element count differs from data.size(), if two tensors share
// a name, if a name is "__metadata__", or if a name or metadata string is not
// valid UTF-8. Throws IoError naming the path if the file cannot be written.
// `what` names the file in the IoError of a failed write ("PATH: could not
// write WHAT (why).").
void save_safetensors(const std::filesystem::path& path, std::span<const TensorRef> tensors,
                      const std::map<std::string, std::string>& metadata = {}, std::string_view what = "the weights");

// Reads every tensor and the metadata of a safetensors file.
//
// Treats the file as untrusted: throws IoError naming the file and the defect
// if it is missing or unreadable, shorter than 8 bytes, its header length is
// larger than the file or kMaxSafetensorsHeaderBytes, the header is not a JSON
// object of the layout above (missing or mistyped fields, duplicate names,
// non-string metadata), a dtype is not F32, a dimension is negative, a tensor's
// offsets are reversed, out of range or do not hold product(shape)*4 bytes, or
// tensors overlap or leave bytes of the data section unused. Unknown scalar
// fields in a tensor entry are ignored, as the reference implementation does.
//
// So that a hostile header cannot demand absurd memory, it also refuses what no
// real file has: containers nested deeper than the layout above, lists longer
// than 1024 numbers and more than 65536 metadata entries. Tensor memory is only
// allocated once the entries are known to tile the data section, so it never
// exceeds the file size.
SafetensorsFile load_safetensors(const std::filesystem::path& path);

}  // namespace lockstep::nn
