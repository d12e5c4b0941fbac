#include "lockstep/nn/weights_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/nn/model.h"
#include "lockstep/nn/safetensors.h"
#include "temp_dir_test.h"

namespace lockstep::nn {
namespace {

namespace fs = std::filesystem;

class WeightsFileTest : public lockstep::testing::TempDirTest {
 protected:
  static std::unique_ptr<Model> mlp(std::vector<std::int64_t> hidden, std::uint64_t seed) {
    auto m = make_mlp(20, hidden, 4);
    m->init(seed);
    return m;
  }

  // Runs load_weights and returns the IoError's message ("" if none thrown).
  static std::string load_error(const fs::path& p, const Layout& layout) {
    try {
      load_weights(p, layout);
    } catch (const IoError& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(WeightsFileTest, RoundTripIsBitwise) {
  auto model = mlp({8, 6}, 42);
  // Include values that a lossy path (text, half precision) would not keep.
  auto p = model->params();
  p[0] = 1e-38f;
  p[1] = -0.0f;
  p[2] = 3.4e38f;
  p[3] = 0.1f;
  const fs::path file = dir_ / "w.safetensors";
  save_weights(file, model->layout(), model->params(), {{"format", "pt"}});
  const auto loaded = load_weights(file, model->layout());
  ASSERT_EQ(loaded.size(), model->params().size());
  EXPECT_EQ(0, std::memcmp(loaded.data(), model->params().data(), loaded.size() * sizeof(float)));

  // The file holds PyTorch names and shapes, values in layout order.
  const auto raw = load_safetensors(file);
  ASSERT_EQ(raw.tensors.size(), model->layout().tensors().size());
  for (const auto& t : model->layout().tensors()) {
    const TensorData* d = nullptr;
    for (const auto& x : raw.tensors)
      if (x.name == t.name) d = &x;
    ASSERT_NE(d, nullptr) << t.name;
    EXPECT_EQ(d->shape, t.shape);
    ASSERT_EQ(d->data.size(), t.numel);
    EXPECT_EQ(0, std::memcmp(d->data.data(), model->params().data() + t.offset, t.numel * sizeof(float)));
  }
  EXPECT_EQ(raw.metadata.at("format"), "pt");

  // A second model loads the same values into its own arena.
  auto other = mlp({8, 6}, 7);
  const auto into_other = load_weights(file, other->layout());
  EXPECT_EQ(into_other, loaded);
}

TEST_F(WeightsFileTest, DifferentHiddenWidthThrowsNamingTheTensor) {
  auto saved = mlp({8}, 1);
  const fs::path file = dir_ / "w.safetensors";
  save_weights(file, saved->layout(), saved->params());
  auto wider = mlp({9}, 1);
  const std::string msg = load_error(file, wider->layout());
  ASSERT_FALSE(msg.empty()) << "a file from another hidden width must not load";
  EXPECT_NE(msg.find("'0.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 20]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[9, 20]"), std::string::npos) << msg;
  EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
}

TEST_F(WeightsFileTest, MissingTensorThrowsNamingIt) {
  auto saved = mlp({8}, 1);  // tensors 0.*, 2.*
  const fs::path file = dir_ / "w.safetensors";
  save_weights(file, saved->layout(), saved->params());
  auto deeper = mlp({8, 4}, 1);  // 0.*, 2.* (same shapes: 4 classes), 4.*
  const std::string msg = load_error(file, deeper->layout());
  ASSERT_FALSE(msg.empty());
  EXPECT_NE(msg.find("'4.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST_F(WeightsFileTest, ExtraTensorThrowsNamingIt) {
  auto model = mlp({8}, 1);
  const fs::path file = dir_ / "w.safetensors";
  // Every tensor of the model, plus one more.
  Layout bigger;
  for (const auto& t : model->layout().tensors()) bigger.add(t.name, t.shape);
  bigger.add("extra.weight", {3, 2});
  std::vector<float> values(bigger.numel(), 0.5f);
  std::copy(model->params().begin(), model->params().end(), values.begin());
  save_weights(file, bigger, values);
  const std::string msg = load_error(file, model->layout());
  ASSERT_FALSE(msg.empty()) << "a file with an extra tensor must not load";
  EXPECT_NE(msg.find("'extra.weight'"), std::string::npos) << msg;
}

TEST_F(WeightsFileTest, MissingFileThrowsIoError) {
  auto model = mlp({8}, 1);
  EXPECT_THROW(load_weights(dir_ / "absent.safetensors", model->layout()), IoError);
}

// Parameters and buffers (batch norm's running statistics) in one file, as a
// PyTorch state_dict; a file of weights only loads with no buffers; a file
// with some of them, or loaded as weights only, is refused by name.
TEST_F(WeightsFileTest, BuffersTravelWithTheWeightsAllOrNone) {
  Layout params, buffers;
  params.add("1.weight", {3});
  params.add("1.bias", {3});
  buffers.add("1.running_mean", {3});
  buffers.add("1.running_var", {3});
  buffers.add("1.num_batches_tracked", {});
  const std::vector<float> p = {1, 2, 3, 4, 5, 6}, b = {0.5f, -0.25f, 1e-30f, 2, 3, 4, 17};
  const fs::path both = dir_ / "both.safetensors";
  save_weights(both, params, p, buffers, b);
  const LoadedState s = load_state(both, params, buffers);
  EXPECT_EQ(s.params, p);
  ASSERT_TRUE(s.buffers.has_value());
  EXPECT_EQ(*s.buffers, b);
  try {
    load_weights(both, params);
    ADD_FAILURE() << "a file with buffers loaded as weights only";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'1.running_mean' is not part of the model"), std::string::npos) << e.what();
  }

  const fs::path weights_only = dir_ / "weights_only.safetensors";
  save_weights(weights_only, params, p);
  const LoadedState w = load_state(weights_only, params, buffers);
  EXPECT_EQ(w.params, p);
  EXPECT_FALSE(w.buffers.has_value());

  Layout some;
  some.add("1.running_mean", {3});
  const fs::path partial = dir_ / "partial.safetensors";
  save_weights(partial, params, p, some, std::vector<float>{1, 2, 3});
  try {
    load_state(partial, params, buffers);
    ADD_FAILURE() << "a file with some of the buffers loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'1.running_var' [3] is missing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::nn
