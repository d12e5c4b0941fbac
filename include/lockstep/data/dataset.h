// In-memory image-classification data sets loaded from IDX files
// (MNIST / Fashion-MNIST layout).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace lockstep::data {

// A labelled data set held entirely in memory. Owns its arrays.
struct Dataset {
  std::int64_t size = 0;             // number of examples
  std::int64_t features = 0;         // floats per example
  std::vector<std::int64_t> shape;   // of one example as the file gives it, e.g. {28, 28}; empty when
                                     // unknown (a set built in code), else its product is `features`
  int num_classes = 0;               // labels are in [0, num_classes)
  std::vector<float> inputs;         // size x features, row-major
  std::vector<std::int32_t> labels;  // size entries

  // Row i of inputs (a view into this Dataset; valid while it lives and is
  // not resized). Throws lockstep::InvalidArgument if i is not in [0, size).
  std::span<const float> input(std::int64_t i) const;
};

// One example's shape as text: "28x28", "1x28x28"; "single values" if empty.
std::string shape_text(const std::vector<std::int64_t>& shape);

struct DatasetOptions {
  // false: inputs are pixel / 255 as float32, in [0, 1].
  // true:  inputs are (pixel / 255 - mean) / stddev, with mean and stddev
  //        taken over every pixel of the TRAIN images and applied to both sets.
  bool normalize = false;
  // Bytes the loader may take (the files' bytes and their pixels as float32,
  // 5 per pixel); more throws InvalidArgument naming the file. None: no
  // limit. `lockstep train` gives the memory the host has free, where known.
  std::optional<double> memory_budget_bytes;
};

struct ImageClassificationData {
  Dataset train;
  Dataset test;
  std::filesystem::path dir;  // the directory the files were read from
  float mean = 0;             // normalization stats (0 and 1 unless normalize)
  float stddev = 1;
};

// Loads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte
// and t10k-labels-idx1-ubyte from `dir`. Each may be plain or have a .gz
// suffix; if both exist the plain file is used.
// Throws lockstep::IoError (naming the file or directory) if a file is missing
// or unreadable (see read_idx), if images are not type 0x08 with >= 2 dims or
// labels not type 0x08 with 1 dim, if image and label counts differ, if train
// and test feature counts differ, if a test label is >= num_classes
// (= max train label + 1), or if normalize is asked for but every train pixel
// has the same value.
ImageClassificationData load_image_classification(const std::filesystem::path& dir,
                                                  const DatasetOptions& options = {});

// Every file load_image_classification(dir) may read: each of the four
// names above, plain and with .gz, whether or not it exists.
std::vector<std::filesystem::path> image_classification_files(const std::filesystem::path& dir);

// Where Debian's dataset-fashion-mnist package installs Fashion-MNIST:
// /usr/share/datasets/fashion-mnist.
std::filesystem::path default_data_dir();

}  // namespace lockstep::data
