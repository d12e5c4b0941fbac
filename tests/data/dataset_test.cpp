#include "lockstep/data/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "lockstep/data/idx.h"
#include "lockstep/error.h"
#include "temp_dir_test.h"

namespace lockstep::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

constexpr std::int64_t kTrain = 10;
constexpr std::int64_t kTest = 4;
constexpr std::int64_t kRows = 2;
constexpr std::int64_t kCols = 3;
constexpr std::int64_t kFeatures = kRows * kCols;

// Deterministic pixels covering 0 and 255.
Bytes pixels(std::int64_t count, std::int64_t offset) {
  Bytes b(static_cast<std::size_t>(count * kFeatures));
  for (std::size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<std::uint8_t>(((i + static_cast<std::size_t>(offset)) * 23) % 256);
  }
  b[0] = 0;
  b[1] = 255;
  return b;
}

const Bytes kTrainPixels = pixels(kTrain, 0);
const Bytes kTestPixels = pixels(kTest, 7);
const Bytes kTrainLabels = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4};  // max 4 -> 5 classes
const Bytes kTestLabels = {4, 0, 2, 1};

class DatasetTest : public lockstep::testing::TempDirTest {
 protected:
  void write(const std::string& name, std::vector<std::int64_t> dims, const Bytes& data,
             std::uint8_t type = 0x08) {
    const bool gzip = name.size() > 3 && name.ends_with(".gz");
    write_idx(dir_ / name, type, dims, data, gzip);
  }

  // The standard tiny fixture: 10 train and 4 test images of 2x3 pixels.
  void write_fixture(bool gzip_train_images = false) {
    write(gzip_train_images ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte",
          {kTrain, kRows, kCols}, kTrainPixels);
    write("train-labels-idx1-ubyte", {kTrain}, kTrainLabels);
    write("t10k-images-idx3-ubyte.gz", {kTest, kRows, kCols}, kTestPixels);
    write("t10k-labels-idx1-ubyte", {kTest}, kTestLabels);
  }

  // Expects load_image_classification(dir_) to throw IoError whose message
  // contains every word in `words`.
  void expect_load_error(std::initializer_list<std::string> words) {
    try {
      load_image_classification(dir_);
      ADD_FAILURE() << "load_image_classification did not throw";
    } catch (const IoError& e) {
      const std::string msg = e.what();
      for (const auto& w : words)
        EXPECT_NE(msg.find(w), std::string::npos) << "want '" << w << "' in: " << msg;
    }
  }
};

void expect_pixels(const Dataset& set, const Bytes& raw, const Bytes& labels) {
  ASSERT_EQ(set.size, static_cast<std::int64_t>(labels.size()));
  ASSERT_EQ(set.features, kFeatures);
  ASSERT_EQ(set.inputs.size(), raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    EXPECT_EQ(set.inputs[i], static_cast<float>(raw[i]) / 255.0f) << "pixel " << i;
  }
  ASSERT_EQ(set.labels.size(), labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(set.labels[i], labels[i]);
}

TEST_F(DatasetTest, LoadsPixelsOver255AndLabels) {
  write_fixture();
  const ImageClassificationData d = load_image_classification(dir_);
  expect_pixels(d.train, kTrainPixels, kTrainLabels);
  expect_pixels(d.test, kTestPixels, kTestLabels);
  EXPECT_EQ(d.train.num_classes, 5);
  EXPECT_EQ(d.test.num_classes, 5);
  EXPECT_EQ(d.dir, dir_);
  EXPECT_EQ(d.mean, 0.0f);
  EXPECT_EQ(d.stddev, 1.0f);
  EXPECT_EQ(d.train.inputs[0], 0.0f);
  EXPECT_EQ(d.train.inputs[1], 1.0f);

  const std::span<const float> row = d.test.input(2);
  ASSERT_EQ(row.size(), static_cast<std::size_t>(kFeatures));
  for (std::int64_t j = 0; j < kFeatures; ++j) {
    EXPECT_EQ(row[j], static_cast<float>(kTestPixels[2 * kFeatures + j]) / 255.0f);
  }
}

TEST_F(DatasetTest, InputOutOfRangeIsInvalidArgument) {
  write_fixture();
  const ImageClassificationData d = load_image_classification(dir_);
  EXPECT_THROW(d.train.input(kTrain), InvalidArgument);
  EXPECT_THROW(d.train.input(-1), InvalidArgument);
  EXPECT_NO_THROW(d.train.input(kTrain - 1));
}

TEST_F(DatasetTest, PlainAndGzipFilesMix) {
  write_fixture(/*gzip_train_images=*/true);
  const ImageClassificationData d = load_image_classification(dir_);
  expect_pixels(d.train, kTrainPixels, kTrainLabels);
}

TEST_F(DatasetTest, PrefersPlainFileWhenBothExist) {
  write_fixture();
  write("train-labels-idx1-ubyte.gz", {3}, {9, 9, 9});  // would fail if chosen
  const ImageClassificationData d = load_image_classification(dir_);
  expect_pixels(d.train, kTrainPixels, kTrainLabels);
}

TEST_F(DatasetTest, NormalizeUsesTrainStatsForBothSets) {
  write_fixture();
  const ImageClassificationData d = load_image_classification(dir_, {.normalize = true});
  double sum = 0, sq = 0;
  for (std::uint8_t p : kTrainPixels) sum += p / 255.0;
  const double want_mean = sum / static_cast<double>(kTrainPixels.size());
  for (std::uint8_t p : kTrainPixels) sq += (p / 255.0 - want_mean) * (p / 255.0 - want_mean);
  const double want_std = std::sqrt(sq / static_cast<double>(kTrainPixels.size()));
  EXPECT_NEAR(d.mean, want_mean, 1e-6);
  EXPECT_NEAR(d.stddev, want_std, 1e-6);

  double m = 0, v = 0;
  for (float x : d.train.inputs) m += x;
  m /= static_cast<double>(d.train.inputs.size());
  for (float x : d.train.inputs) v += (x - m) * (x - m);
  v /= static_cast<double>(d.train.inputs.size());
  EXPECT_NEAR(m, 0.0, 1e-5);
  EXPECT_NEAR(std::sqrt(v), 1.0, 1e-4);

  ASSERT_EQ(d.test.inputs.size(), kTestPixels.size());
  for (std::size_t i = 0; i < kTestPixels.size(); ++i) {
    EXPECT_NEAR(d.test.inputs[i], (kTestPixels[i] / 255.0 - want_mean) / want_std, 1e-5);
  }
}

TEST_F(DatasetTest, NormalizeConstantImagesIsAnError) {
  write_fixture();
  write("train-images-idx3-ubyte", {kTrain, kRows, kCols}, Bytes(kTrain * kFeatures, 42));
  try {
    load_image_classification(dir_, {.normalize = true});
    ADD_FAILURE() << "did not throw";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("same value"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(load_image_classification(dir_));
}

TEST_F(DatasetTest, MismatchedCountsNameBothFiles) {
  write_fixture();
  write("train-labels-idx1-ubyte", {9}, Bytes(kTrainLabels.begin(), kTrainLabels.end() - 1));
  expect_load_error({"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "10 images", "9 labels"});
}

TEST_F(DatasetTest, MissingFileNamesDirectoryAndFile) {
  write_fixture();
  fs::remove(dir_ / "t10k-labels-idx1-ubyte");
  expect_load_error({dir_.string(), "t10k-labels-idx1-ubyte", "--data DIR"});
}

// A directory that cannot be read is named as such, not as one that does
// not exist (a symlink loop said "no such directory").
TEST_F(DatasetTest, ASymlinkLoopIsNotCalledMissing) {
  const fs::path a = dir_ / "loop_a", b = dir_ / "loop_b";
  fs::create_symlink(b, a);
  fs::create_symlink(a, b);
  try {
    load_image_classification(a);
    ADD_FAILURE() << "a symlink loop loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be read (Too many levels of symbolic links)"), std::string::npos)
        << e.what();
  }
}

// A data set whose pixels as float32 would not fit in the memory left is
// refused naming the file (a 600 KB gzip of zeros took 3 GB), and a link to
// nothing is named as such, not as a file that is absent.
TEST_F(DatasetTest, ADataSetPastTheMemoryBudgetIsRefusedNamingTheFile) {
  write_fixture();
  EXPECT_NO_THROW(load_image_classification(dir_, {.memory_budget_bytes = 1e9}));
  try {
    load_image_classification(dir_, {.memory_budget_bytes = 100});
    ADD_FAILURE() << "loaded past its budget";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("train-images-idx3-ubyte"), std::string::npos) << msg;
    EXPECT_NE(msg.find("give a smaller data set (--data DIR)"), std::string::npos) << msg;
  }
  // No budget is no limit; a budget of 0 (a full container) is a limit, not "unknown".
  EXPECT_NO_THROW(load_image_classification(dir_, {.memory_budget_bytes = std::nullopt}));
  EXPECT_THROW(load_image_classification(dir_, {.memory_budget_bytes = 0.0}), InvalidArgument);
}

TEST_F(DatasetTest, ALinkToNothingIsNamedAsSuch) {
  write_fixture();
  fs::remove(dir_ / "t10k-labels-idx1-ubyte");
  fs::create_symlink(dir_ / "gone", dir_ / "t10k-labels-idx1-ubyte");
  expect_load_error({"t10k-labels-idx1-ubyte", "is a symbolic link to", "which does not exist"});
}

TEST_F(DatasetTest, MissingDirectory) {
  const fs::path missing = dir_ / "absent";
  try {
    load_image_classification(missing);
    ADD_FAILURE() << "did not throw";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(missing.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("--data DIR"), std::string::npos) << msg;
  }
}

TEST_F(DatasetTest, CorruptFileErrorNamesIt) {
  write_fixture();
  write_idx(dir_ / "t10k-labels-idx1-ubyte", 0x08, std::vector<std::int64_t>{kTest}, kTestLabels, false);
  fs::resize_file(dir_ / "t10k-labels-idx1-ubyte", 8 + 2);
  expect_load_error({"t10k-labels-idx1-ubyte", "truncated"});
}

TEST_F(DatasetTest, ImagesNeedTwoDimsAndUnsignedBytes) {
  write_fixture();
  write("train-images-idx3-ubyte", {kTrain * kFeatures}, kTrainPixels);
  expect_load_error({"train-images-idx3-ubyte", "at least 2 dimensions"});
  write("train-images-idx3-ubyte", {kTrain, kFeatures / 2}, kTrainPixels, 0x0B);
  expect_load_error({"train-images-idx3-ubyte", "0x08", "0x0b"});
}

TEST_F(DatasetTest, LabelsNeedOneDimAndUnsignedBytes) {
  write_fixture();
  write("train-labels-idx1-ubyte", {kTrain, 1}, kTrainLabels);
  expect_load_error({"train-labels-idx1-ubyte", "exactly 1 dimension"});
  write("train-labels-idx1-ubyte", {kTrain}, kTrainLabels, 0x09);
  expect_load_error({"train-labels-idx1-ubyte", "0x09"});
}

TEST_F(DatasetTest, TrainAndTestFeaturesMustMatch) {
  write_fixture();
  write("t10k-images-idx3-ubyte.gz", {kTest, 2, 2}, Bytes(kTest * 4, 1));
  expect_load_error({"train-images-idx3-ubyte", "t10k-images-idx3-ubyte", "images of 2x3 (6 values each)",
                     "has images of 2x2 (4 values each)"});
  // The same number of pixels in another shape is another image, too.
  write("t10k-images-idx3-ubyte.gz", {kTest, 3, 2}, Bytes(kTest * 6, 1));
  expect_load_error({"train-images-idx3-ubyte", "images of 2x3", "has images of 3x2"});
}

TEST_F(DatasetTest, TestLabelBeyondTrainClassesIsAnError) {
  write_fixture();
  write("t10k-labels-idx1-ubyte", {kTest}, {0, 1, 5, 2});
  expect_load_error({"t10k-labels-idx1-ubyte", "label 5 at index 2", "5 classes"});
}

TEST(DefaultDataDir, IsDebianFashionMnist) {
  EXPECT_EQ(default_data_dir(), fs::path("/usr/share/datasets/fashion-mnist"));
}

TEST(FashionMnist, LoadsFullDataSet) {
  const fs::path dir = default_data_dir();
  if (!fs::exists(dir / "train-images-idx3-ubyte.gz") && !fs::exists(dir / "train-images-idx3-ubyte")) {
    GTEST_SKIP() << dir << " not installed (Debian package dataset-fashion-mnist)";
  }
  const ImageClassificationData d = load_image_classification(dir);
  EXPECT_EQ(d.train.size, 60000);
  EXPECT_EQ(d.test.size, 10000);
  EXPECT_EQ(d.train.features, 784);
  EXPECT_EQ(d.test.features, 784);
  EXPECT_EQ(d.train.num_classes, 10);
  EXPECT_EQ(d.train.inputs.size(), 60000u * 784u);
  const auto [lo, hi] = std::minmax_element(d.train.inputs.begin(), d.train.inputs.end());
  EXPECT_EQ(*lo, 0.0f);
  EXPECT_EQ(*hi, 1.0f);
  // Fashion-MNIST is balanced: 6000 train and 1000 test images per class.
  std::vector<int> train_counts(10), test_counts(10);
  for (std::int32_t l : d.train.labels) ++train_counts.at(l);
  for (std::int32_t l : d.test.labels) ++test_counts.at(l);
  EXPECT_EQ(train_counts, std::vector<int>(10, 6000));
  EXPECT_EQ(test_counts, std::vector<int>(10, 1000));
}

}  // namespace
}  // namespace lockstep::data
