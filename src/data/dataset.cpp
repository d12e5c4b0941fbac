#include "lockstep/data/dataset.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <optional>
#include <string>

#include "lockstep/data/idx.h"
#include "lockstep/error.h"

namespace lockstep::data {
namespace {

namespace fs = std::filesystem;

constexpr char kTrainImages[] = "train-images-idx3-ubyte";
constexpr char kTrainLabels[] = "train-labels-idx1-ubyte";
constexpr char kTestImages[] = "t10k-images-idx3-ubyte";
constexpr char kTestLabels[] = "t10k-labels-idx1-ubyte";
constexpr std::uint8_t kUnsignedByte = 0x08;

[[noreturn]] void fail(const fs::path& path, const std::string& defect) {
  throw IoError(path.string() + ": " + defect);
}

// dir/name if it exists, else dir/name.gz if that exists, else IoError
// (naming a candidate that cannot be looked at, or a link to nothing).
fs::path find_file(const fs::path& dir, const std::string& name) {
  for (const fs::path& candidate : {dir / name, dir / (name + ".gz")}) {
    std::error_code ec;
    const fs::file_status st = fs::status(candidate, ec);
    if (fs::exists(st)) return candidate;
    if (ec && ec != std::errc::no_such_file_or_directory) fail(candidate, "cannot access: " + ec.message());
    std::error_code link_ec;
    if (fs::is_symlink(fs::symlink_status(candidate, link_ec))) {
      fail(candidate, "is a symbolic link to " + fs::read_symlink(candidate, link_ec).string() +
                          ", which does not exist; point it at the IDX file or remove it");
    }
  }
  fail(dir, "no " + name + " or " + name +
                ".gz in this directory; point the data directory (--data DIR) at an "
                "IDX data set (MNIST layout, e.g. Fashion-MNIST)");
}

std::string type_hex(std::uint8_t code) {
  constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[code >> 4] + kDigits[code & 15];
}

// The bytes still free for the data; none: no limit.
using Budget = std::optional<double>;

// A header check for read_idx: the file's data, `per_byte` bytes of memory
// for each byte it holds (5 for images: the byte read and its float32), must
// fit in what is left of `budget`, before any of it is read. A small gzip file
// can hold gigabytes; past the budget the kernel's OOM killer would end the
// run without a word.
IdxHeaderCheck within(Budget& budget, const fs::path& path, double per_byte) {
  return [&budget, path, per_byte](const IdxArray& header, std::uint64_t data_bytes) {
    if (!budget) return;
    const double need = per_byte * double(data_bytes);
    if (need > *budget) {
      throw InvalidArgument(path.string() + ": its " + std::to_string(header.dims[0]) + " entries take " +
                            std::to_string(static_cast<long long>(need / 1e6)) + " MB in memory, more than the " +
                            std::to_string(static_cast<long long>(std::max(0.0, *budget) / 1e6)) +
                            " MB left free for the data; give a smaller data set (--data DIR), or free memory for it.");
    }
    *budget -= need;
  };
}

// Note [Huge pages for the data]: the inputs as floats are 4 bytes a pixel
// (188 MB for Fashion-MNIST's training set), and touching them first in 4 KiB
// pages cost half of a run's start-up on this VM (page faults, 0.6 s of 1.3
// s). Transparent huge pages, where the kernel offers them on request
// (/sys/kernel/mm/transparent_hugepage/enabled: madvise), take 512 times
// fewer faults. Only the 2 MiB-aligned interior of the buffer can be huge;
// a kernel that refuses leaves the 4 KiB pages, as before.
template <class T>
void reserve_on_huge_pages(std::vector<T>& v, std::size_t n) {
  v.reserve(n);
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<std::uintptr_t>(v.data());
  const std::uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1), last = (begin + n * sizeof(T)) & ~(kHuge - 1);
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
}

// Reads an image file and a label file into a Dataset of pixel / 255 values.
// num_classes is left at 0 for the caller to set.
Dataset load_pair(const fs::path& images_path, const fs::path& labels_path, Budget& budget) {
  const IdxArray images = read_idx(images_path, within(budget, images_path, 5));
  if (images.type_code != kUnsignedByte) {
    fail(images_path,
         "images must be unsigned bytes (IDX type 0x08) but the type is " + type_hex(images.type_code));
  }
  if (images.dims.size() < 2) {
    fail(images_path, "images need at least 2 dimensions (count, then pixels) but the file has " +
                          std::to_string(images.dims.size()));
  }
  const IdxArray labels = read_idx(labels_path, within(budget, labels_path, 5));
  if (labels.type_code != kUnsignedByte) {
    fail(labels_path,
         "labels must be unsigned bytes (IDX type 0x08) but the type is " + type_hex(labels.type_code));
  }
  if (labels.dims.size() != 1) {
    fail(labels_path,
         "labels need exactly 1 dimension but the file has " + std::to_string(labels.dims.size()));
  }
  if (images.dims[0] != labels.dims[0]) {
    throw IoError(images_path.string() + " holds " + std::to_string(images.dims[0]) + " images but " +
                  labels_path.string() + " holds " + std::to_string(labels.dims[0]) +
                  " labels; the counts must match");
  }

  Dataset set;
  set.size = images.dims[0];
  set.features = static_cast<std::int64_t>(images.bytes.size()) / set.size;
  set.shape.assign(images.dims.begin() + 1, images.dims.end());
  reserve_on_huge_pages(set.inputs, images.bytes.size());
  set.inputs.resize(images.bytes.size());
  std::transform(images.bytes.begin(), images.bytes.end(), set.inputs.begin(),
                 [](std::uint8_t p) { return static_cast<float>(p) / 255.0f; });
  set.labels.assign(labels.bytes.begin(), labels.bytes.end());
  return set;
}

void normalize_in_place(std::vector<float>& values, float mean, float stddev) {
  for (float& v : values) v = (v - mean) / stddev;
}

}  // namespace

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s.empty() ? "single values" : s;
}

std::span<const float> Dataset::input(std::int64_t i) const {
  if (i < 0 || i >= size) {
    throw InvalidArgument("Dataset::input: row " + std::to_string(i) + " is outside [0, " +
                          std::to_string(size) + ")");
  }
  return std::span<const float>(inputs).subspan(static_cast<std::size_t>(i * features),
                                                static_cast<std::size_t>(features));
}

ImageClassificationData load_image_classification(const std::filesystem::path& dir,
                                                  const DatasetOptions& options) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    fail(dir, "is a file; give the directory (--data DIR) that holds the IDX files (MNIST layout, e.g. Fashion-MNIST)");
  }
  const bool is_dir = fs::is_directory(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {  // a symlink loop, a directory we may not enter
    fail(dir, "cannot be read (" + ec.message() + "); point the data directory (--data DIR) at an IDX data set");
  }
  if (!is_dir) {
    fail(dir,
         "no such directory; point the data directory (--data DIR) at an IDX data set (MNIST layout, "
         "e.g. Fashion-MNIST)");
  }
  const fs::path train_images = find_file(dir, kTrainImages);
  const fs::path train_labels = find_file(dir, kTrainLabels);
  const fs::path test_images = find_file(dir, kTestImages);
  const fs::path test_labels = find_file(dir, kTestLabels);

  ImageClassificationData data;
  data.dir = dir;
  Budget budget = options.memory_budget_bytes;
  data.train = load_pair(train_images, train_labels, budget);
  data.test = load_pair(test_images, test_labels, budget);
  if (data.train.shape != data.test.shape) {
    const auto text = [](const Dataset& d) {
      return "images of " + shape_text(d.shape) + " (" + std::to_string(d.features) + " values each)";
    };
    throw IoError(train_images.string() + " has " + text(data.train) + " but " + test_images.string() + " has " +
                  text(data.test) + "; train and test must match");
  }

  const auto max_label = *std::max_element(data.train.labels.begin(), data.train.labels.end());
  const int num_classes = max_label + 1;
  for (std::size_t i = 0; i < data.test.labels.size(); ++i) {
    if (data.test.labels[i] >= num_classes) {
      fail(test_labels, "label " + std::to_string(data.test.labels[i]) + " at index " + std::to_string(i) +
                            " is out of range: the train labels give " + std::to_string(num_classes) +
                            " classes (0 to " + std::to_string(max_label) + ")");
    }
  }
  data.train.num_classes = num_classes;
  data.test.num_classes = num_classes;

  if (options.normalize) {
    double sum = 0;
    for (float v : data.train.inputs) sum += v;
    const double mean = sum / static_cast<double>(data.train.inputs.size());
    double sq = 0;
    for (float v : data.train.inputs) sq += (v - mean) * (v - mean);
    const double stddev = std::sqrt(sq / static_cast<double>(data.train.inputs.size()));
    if (!(stddev > 0)) {
      fail(train_images, "cannot normalize: every train pixel has the same value");
    }
    data.mean = static_cast<float>(mean);
    data.stddev = static_cast<float>(stddev);
    normalize_in_place(data.train.inputs, data.mean, data.stddev);
    normalize_in_place(data.test.inputs, data.mean, data.stddev);
  }
  return data;
}

std::vector<std::filesystem::path> image_classification_files(const std::filesystem::path& dir) {
  std::vector<fs::path> files;
  for (const char* name : {kTrainImages, kTrainLabels, kTestImages, kTestLabels}) {
    files.push_back(dir / name);
    files.push_back(dir / (std::string(name) + ".gz"));
  }
  return files;
}

std::filesystem::path default_data_dir() {
  return "/usr/share/datasets/fashion-mnist";
}

}  // namespace lockstep::data
