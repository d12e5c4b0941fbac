// own_model: a model of your own, trained by lockstep's trainer.
//
// The model is built here from the public layers (nn/layer.h): an MLP that neither built-in
// model is, with batch norm (buffers) and dropout,
//   Linear(784, 256) BatchNorm2d(16 x 4 x 4) ReLU Dropout(0.2) Linear(256, 128) ReLU Linear(128, 10)
// and handed to train::train() through TrainConfig::model_factory. Everything else is the
// trainer's: N replicas in lockstep, the bucketed all-reduce overlapping backward, batch-norm
// statistics synchronised (--bn-stats sync), the divergence and data-accounting guards, and the
// result. It trains on Fashion-MNIST (Debian's dataset-fashion-mnist, or --data DIR) and then
// shows the guarantee that comes with the trainer: under `deterministic` the same model gives
// bit-identical weights for 1 replica and for N. It exits 1 if the test accuracy is under
// --min-accuracy or the weights differ, 2 for a bad flag.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/data/dataset.h"
#include "lockstep/error.h"
#include "lockstep/nn/layer.h"
#include "lockstep/nn/model.h"
#include "lockstep/train/trainer.h"

namespace data = lockstep::data;
namespace nn = lockstep::nn;
namespace train = lockstep::train;

namespace {

// The user's model, for `features` inputs (784 for 28 x 28 images) and `classes` outputs. The
// trainer calls this for every replica; it must build the same layers every time.
std::unique_ptr<nn::Model> bn_mlp(std::int64_t features, std::int64_t classes) {
  std::vector<std::unique_ptr<nn::Layer>> layers;
  layers.push_back(nn::make_linear(features, 256));
  layers.push_back(nn::make_batch_norm2d({.channels = 16, .height = 4, .width = 4}));  // 256 = 16 x 4 x 4
  layers.push_back(nn::make_relu(256));
  layers.push_back(nn::make_dropout(256, 0.2f));
  layers.push_back(nn::make_linear(256, 128));
  layers.push_back(nn::make_relu(128));
  layers.push_back(nn::make_linear(128, classes));
  return std::make_unique<nn::Model>(std::move(layers));
}

train::TrainConfig config(int replicas, std::int64_t micro_batch) {
  train::TrainConfig c;
  c.model = "bn_mlp";  // a name of its own: it travels in checkpoints, reports and the handshake
  c.model_factory = bn_mlp;
  c.replicas = replicas;
  c.micro_batch = micro_batch;
  c.bn_stats = train::BnStats::Sync;  // every replica holds the same running statistics
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"own_model: a model of your own, trained by lockstep's trainer (examples/README.md)"};
  std::string data_dir = data::default_data_dir().string();
  int replicas = 8;
  std::int64_t epochs = 1, steps = 0, check_steps = 20;
  double min_accuracy = 0.80;
  app.add_option("--data", data_dir, "IDX data set (Fashion-MNIST by default)");
  app.add_option("--replicas", replicas, "replicas, as threads")->check(CLI::Range(1, 64));
  app.add_option("--epochs", epochs, "epochs of training")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{100}));
  app.add_option("--steps", steps, "stop after this many steps instead (0: the epochs)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_option("--check-steps", check_steps, "steps of the 1-against-N bit-exactness check (0: none)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1000}));
  app.add_option("--min-accuracy", min_accuracy, "exit 1 under this test accuracy")
      ->check(CLI::Range(0.0, 1.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "own_model: error: %s\n", e.what());
    return 2;
  }
  try {
    const data::ImageClassificationData d = data::load_image_classification(data_dir);

    // 1. Train: N replicas of the user's model, 32 samples each per step.
    auto c = config(replicas, 32);
    c.epochs = epochs;
    c.steps = steps;
    const train::TrainResult r = train::train(c, d);
    const double accuracy = r.test_accuracy.value_or(0);
    std::printf("bn_mlp, %d x 32: %lld steps, final loss %.4f, test accuracy %.4f, %.0f samples/s\n",
                replicas, static_cast<long long>(r.steps), r.final_loss, accuracy, r.samples_per_s);

    // 2. The guarantee: bit-identical weights for 1 replica and for N (each step's global batch
    //    of 256 cut into 256 / N per replica), whatever the model.
    bool identical = true;
    if (check_steps > 0 && (replicas & (replicas - 1)) != 0) {  // deterministic mode's own rule
      std::printf("bit-exactness check skipped: deterministic mode needs a power-of-two replica count\n");
    } else if (check_steps > 0) {
      std::vector<float> weights[2];
      for (int i = 0; i < 2; ++i) {
        const int n = i == 0 ? 1 : replicas;
        auto exact = config(n, 256 / n);
        exact.deterministic = true;
        exact.steps = check_steps;
        exact.evaluate = false;
        weights[i] = train::train(exact, d).params;
      }
      identical = weights[0].size() == weights[1].size() &&
                  std::memcmp(weights[0].data(), weights[1].data(), weights[0].size() * sizeof(float)) == 0;
      std::printf("deterministic, %lld steps of 256: 1 replica and %d replicas end with %s weights\n",
                  static_cast<long long>(check_steps), replicas, identical ? "bit-identical" : "DIFFERENT");
    }
    if (accuracy < min_accuracy || !identical) {
      std::fprintf(stderr, "own_model: %s\n",
                   !identical ? "the weights of 1 and N replicas differ"
                              : ("test accuracy " + std::to_string(accuracy) + " is under --min-accuracy " +
                                 std::to_string(min_accuracy))
                                    .c_str());
      return 1;
    }
    std::printf("ok: the user's model trained in lockstep\n");
    return 0;
  } catch (const lockstep::InvalidArgument& e) {
    std::fprintf(stderr, "own_model: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "own_model: error: %s\n", e.what());
    return 1;
  }
}
