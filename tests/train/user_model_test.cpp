// A model of the user's own (TrainConfig::model_factory) through train():
// resumed from a checkpoint as the unbroken run, guarded against divergence;
// a factory that breaks its contract, and a name that would pass for a
// built-in model, are refused. Bit-exact for any replica count:
// deterministic_test.cpp.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "comm/run_ranks.h"
#include "lockstep/error.h"
#include "lockstep/nn/gemm.h"
#include "lockstep/nn/layer.h"
#include "lockstep/nn/model.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/trainer.h"
#include "synthetic_data.h"
#include "train_helpers.h"
#include "user_models.h"

namespace lockstep::train {
namespace {

using testing::bn_mlp;
using testing::expect_refused;
using testing::same_bits;
using testing::synthetic_data;

// y = x + b, a layer of the user's own whose parameter is named `name`.
class Shift : public nn::Layer {
 public:
  Shift(std::int64_t features, std::string name) : features_(features), name_(std::move(name)) {}
  std::string describe() const override { return "Shift(" + std::to_string(features_) + ")"; }
  std::int64_t in_features() const override { return features_; }
  std::int64_t out_features() const override { return features_; }
  std::vector<nn::ParamDecl> params() const override { return {{name_, {features_}}}; }
  void bind(std::span<float* const> params, std::span<float* const> grads) override {
    b_ = params[0];
    db_ = grads[0];
  }
  // x: (B, F) -> y: (B, F)
  void forward(const float* x, float* y, std::int64_t batch, const nn::ForwardContext&) override {
    for (std::int64_t i = 0; i < batch * features_; ++i) y[i] = x[i] + b_[i % features_];
  }
  void backward(const float*, const float*, const float* dy, float* dx, std::int64_t batch,
                bool accumulate) override {
    if (!accumulate) std::fill(db_, db_ + features_, 0.0f);
    for (std::int64_t i = 0; i < batch * features_; ++i) {
      db_[i % features_] += dy[i];
      if (dx != nullptr) dx[i] = dy[i];
    }
  }

 private:
  std::int64_t features_;
  std::string name_;
  float* b_ = nullptr;
  float* db_ = nullptr;
};

TrainConfig user_config(int replicas) {
  TrainConfig c;
  c.model = "bn-mlp";
  c.model_factory = [](std::int64_t features, std::int64_t classes) { return bn_mlp(features, classes); };
  c.replicas = replicas;
  c.micro_batch = 16;
  c.steps = 12;
  c.lr = 0.05f;
  c.evaluate = false;
  c.timeout = std::chrono::seconds(20);
  return c;
}

std::string error_of(const TrainConfig& c, const data::ImageClassificationData& data,
                     const TrainHooks& hooks = {}) {
  try {
    train(c, data, hooks);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Through the file, as --checkpoint and --resume: the resumed run ends with
// the unbroken run's weights, buffers (each replica's own, --bn-stats local)
// and optimizer state, bit for bit. A checkpoint of another model, of the
// same layout under another name or of another layout, is refused.
TEST(UserModel, ResumedFromACheckpointEndsAsTheUnbrokenRun) {
  const auto data = synthetic_data(1024);
  auto c = user_config(2);
  c.optimizer = "adamw";
  c.lr = 0.003f;
  c.steps = 20;
  c.checkpoint_every = 6;
  const auto dir =
      std::filesystem::temp_directory_path() / ("lockstep_user_model_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "mid.st";
  std::vector<float> last_replica_buffers, last_state;
  TrainHooks hooks;
  hooks.on_checkpoint = [&](const Checkpoint& cp) {
    if (cp.steps_done == 12) save_checkpoint(path, cp, trajectory_fields(c, data), "bn-mlp");
    last_replica_buffers.assign(cp.replica_buffers.begin(), cp.replica_buffers.end());
    last_state.assign(cp.optimizer_state.begin(), cp.optimizer_state.end());
  };
  const auto whole = train(c, data, hooks);
  ASSERT_EQ(last_replica_buffers.size(), 2 * whole.buffers.size()) << "--bn-stats local: each replica's own";

  auto resumed = c;
  resume_from(resumed, data, load_checkpoint(path, c, data));
  EXPECT_EQ(resumed.start_step, 12);
  std::vector<float> replica_buffers, state;
  TrainHooks after;
  after.on_checkpoint = [&](const Checkpoint& cp) {
    replica_buffers.assign(cp.replica_buffers.begin(), cp.replica_buffers.end());
    state.assign(cp.optimizer_state.begin(), cp.optimizer_state.end());
  };
  const auto r = train(resumed, data, after);
  EXPECT_EQ(r.resumed_from_step, 12);
  EXPECT_TRUE(same_bits(r.params, whole.params));
  EXPECT_TRUE(same_bits(r.buffers, whole.buffers));
  EXPECT_TRUE(same_bits(replica_buffers, last_replica_buffers));
  EXPECT_TRUE(same_bits(state, last_state));

  // The same layers under another name: the name is a trajectory field.
  auto renamed = c;
  renamed.model = "bn-mlp-2";
  try {
    resume_from(renamed, data, load_checkpoint(path, renamed, data));
    ADD_FAILURE() << "a checkpoint of another model's name was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("model name (TrainConfig::model, with model_factory) differs from the run "
                                   "that wrote the checkpoint ('bn-mlp' there, 'bn-mlp-2' here)"),
        std::string::npos)
        << e.what();
  }
  // Another layout under the same name: its tensors do not fit.
  auto wider = c;
  wider.model_factory = [](std::int64_t features, std::int64_t classes) {
    return bn_mlp(features, classes, 20);
  };
  EXPECT_THROW(load_checkpoint(path, wider, data), IoError);
  // The built-in MLP: not its checkpoint either.
  auto mlp = c;
  mlp.model = "mlp";
  mlp.model_factory = nullptr;
  EXPECT_THROW(load_checkpoint(path, mlp, data), IoError);
  std::filesystem::remove_all(dir);
}

// The name is a trajectory field both ways: a user's model built as the
// built-in MLP is (its layers, tensor names and shapes are the same), its
// checkpoint is not resumed as --model mlp's, nor the built-in's as the
// user's. The built-in model's fields hold no name, so the first went
// unchecked: a checkpoint's field that this run lacks was not compared.
TEST(UserModel, ACheckpointIsNotResumedAcrossAUserModelAndABuiltInOne) {
  const auto data = synthetic_data(512);
  auto user = user_config(2);
  user.model = "my-mlp";
  user.hidden = {32};
  user.model_factory = [](std::int64_t features, std::int64_t classes) {
    const std::vector<std::int64_t> hidden = {32};
    return nn::make_mlp(features, hidden, classes);
  };
  auto builtin = user;
  builtin.model = "mlp";
  builtin.model_factory = nullptr;
  const auto dir =
      std::filesystem::temp_directory_path() / ("lockstep_user_model_mlp_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const bool from_user : {true, false}) {
    SCOPED_TRACE(from_user ? "the user's checkpoint, resumed as --model mlp" : "the other way");
    const auto& writer = from_user ? user : builtin;
    const auto& reader = from_user ? builtin : user;
    auto c = writer;
    c.steps = 8;
    c.checkpoint_every = 4;
    const auto path = dir / "mid.st";
    TrainHooks hooks;
    hooks.on_checkpoint = [&](const Checkpoint& cp) {
      if (cp.steps_done == 4) save_checkpoint(path, cp, trajectory_fields(c, data), c.model);
    };
    train(c, data, hooks);
    auto resumed = reader;
    resumed.steps = 8;
    resumed.checkpoint_every = 4;
    try {
      resume_from(resumed, data, load_checkpoint(path, resumed, data));
      ADD_FAILURE() << "resumed across a user's model and the built-in one";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("model name (TrainConfig::model, with model_factory) differs from the "
                                           "run that wrote the checkpoint"),
                std::string::npos)
          << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

// The divergence detector covers a user's model as a built-in one: a bit
// flipped in a weight, or (with synced statistics) in a batch-norm buffer,
// is caught at the next check, naming the rank. Which model has buffers is
// the model's to say, not its name's.
TEST(UserModel, TheDivergenceGuardCatchesABitFlip) {
  const auto data = synthetic_data(1024);
  auto c = user_config(4);
  c.check_every = 4;
  c.bn_stats = BnStats::Sync;
  c.inject = {fault_from_string("bitflip@5:3")};
  auto what = error_of(c, data);
  EXPECT_NE(what.find("replicas diverged by step 7: "), std::string::npos) << what;
  EXPECT_NE(what.find(" on rank 3 differs from ranks 0, 1 and 2"), std::string::npos) << what;
  c.inject = {fault_from_string("bitflip-buffer@5:2")};
  what = error_of(c, data);
  EXPECT_NE(what.find("replicas diverged by step 7: 1.running_"), std::string::npos) << what;
  EXPECT_NE(what.find("(buffer) on rank 2 differs from ranks 0, 1 and 3"), std::string::npos) << what;
  c.inject.clear();
  EXPECT_EQ(train(c, data).divergence_checks, 3);

  // A model of one's own without buffers has none to flip.
  auto plain = c;
  plain.model = "plain";
  plain.model_factory = [](std::int64_t features, std::int64_t classes) {
    std::vector<std::unique_ptr<nn::Layer>> layers;
    layers.push_back(nn::make_linear(features, classes));
    return std::make_unique<nn::Model>(std::move(layers));
  };
  plain.inject = {fault_from_string("bitflip-buffer@5:2")};
  expect_refused(plain, data,
                 "--inject bitflip-buffer needs a model with buffers (batch norm: --model cnn); model "
                 "'plain' (Linear(48, 10)) has none.");
  auto mlp = plain;
  mlp.model = "mlp";
  mlp.model_factory = nullptr;
  expect_refused(mlp, data,
                 "--inject bitflip-buffer needs a model with buffers (batch norm: --model cnn); --model "
                 "mlp has none.");
}

// A factory must build a model, of the data's shape, the same every call:
// otherwise InvalidArgument says which, before a step runs.
TEST(UserModel, AFactoryThatBreaksItsContractIsRefused) {
  const auto data = synthetic_data(512);
  auto c = user_config(2);
  c.model_factory = [](std::int64_t, std::int64_t) { return std::unique_ptr<nn::Model>(); };
  expect_refused(c, data, "TrainConfig::model_factory (model 'bn-mlp') returned no model (null)");
  EXPECT_THROW(trajectory_fields(c, data), InvalidArgument);

  c.model_factory = [](std::int64_t features, std::int64_t) { return bn_mlp(features, 7); };
  expect_refused(c, data, "built a model of 48 inputs and 7 outputs, for data of 48 features and 10 classes");

  // Another model on a later call, with one replica (no peer to compare
  // with in the handshake) and with two.
  for (int replicas : {1, 2}) {
    SCOPED_TRACE(replicas);
    auto calls = std::make_shared<std::atomic<int>>(0);
    c.replicas = replicas;
    c.model_factory = [calls](std::int64_t features, std::int64_t classes) {
      return bn_mlp(features, classes, ++*calls == 1 ? 24 : 20);
    };
    expect_refused(
        c, data,
        "TrainConfig::model_factory built another model for a replica of 'bn-mlp' than on its first call: "
        "its layers are ");
    // A layer of the user's own that says the same of itself (describe())
    // but names its parameter otherwise on a later call.
    *calls = 0;
    c.model_factory = [calls](std::int64_t features, std::int64_t classes) {
      std::vector<std::unique_ptr<nn::Layer>> layers;
      layers.push_back(std::make_unique<Shift>(features, ++*calls == 1 ? "bias" : "shift"));
      layers.push_back(nn::make_linear(features, classes));
      return std::make_unique<nn::Model>(std::move(layers));
    };
    expect_refused(c, data, "parameter 0 is '0.shift' [48] here and '0.bias' [48] in the first");
  }

  // A rank whose factory builds another model (as another process's would)
  // is refused by the start-up handshake, naming it.
  c = user_config(4);
  TrainHooks hooks;
  hooks.on_replica_config = [](int rank, TrainConfig& mine) {
    if (rank == 2)
      mine.model_factory = [](std::int64_t features, std::int64_t classes) {
        return bn_mlp(features, classes, 20);
      };
  };
  auto what = error_of(c, data, hooks);
  EXPECT_NE(
      what.find(
          "start-up handshake refused: model (parameter names, shapes and order) differs on rank 2 from "
          "ranks 0, 1 and 3"),
      std::string::npos)
      << what;
  hooks.on_replica_config = [](int rank, TrainConfig& mine) {
    if (rank == 1) mine.model = "bn-mlp-2";
  };
  what = error_of(c, data, hooks);
  EXPECT_NE(what.find("model name (TrainConfig::model, with model_factory) differs on rank 1"),
            std::string::npos)
      << what;
}

// Over a process group each process plans with its own factory: a factory
// that builds another layout on another rank is refused at start-up, on
// every rank, with InvalidArgument, not trained apart.
TEST(UserModel, ProcessesWhoseFactoriesDisagreeAreRefused) {
  const auto data = synthetic_data(512);
  auto c = user_config(2);
  c.cores = 2;
  setenv("LOCAL_WORLD_SIZE", "2", 1);  // both "processes" ask for one BLAS thread: nobody changes it
  const int blas = nn::blas_threads();
  nn::set_blas_threads(1);
  const auto errors = testing::run_ranks(2, [&](comm::Communicator& comm) {
    auto mine = c;
    const std::int64_t width = comm.rank() == 0 ? 24 : 20;
    mine.model_factory = [width](std::int64_t features, std::int64_t classes) {
      return bn_mlp(features, classes, width);
    };
    train_replica(mine, data, comm);
  });
  nn::set_blas_threads(blas);
  // Each rank throws the handshake's InvalidArgument, unless the other's
  // abort (which carries that message) reached it first.
  int refused = 0;
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const Error& error) {
      refused += dynamic_cast<const InvalidArgument*>(&error) != nullptr;
      EXPECT_NE(std::string(error.what())
                    .find("start-up handshake refused: model (parameter names, shapes and "
                          "order) differs on rank"),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_GE(refused, 1);
}

// The replicas build their models on their own threads, but the factory is
// never called by two at once: it need not be thread-safe.
TEST(UserModel, TheFactoryIsCalledOneCallAtATime) {
  const auto data = synthetic_data(512);
  auto c = user_config(8);
  c.micro_batch = 8;
  c.steps = 2;
  auto inside = std::make_shared<int>(0);  // unguarded on purpose
  auto overlapped = std::make_shared<std::atomic<bool>>(false);
  auto calls = std::make_shared<std::atomic<int>>(0);
  c.model_factory = [=](std::int64_t features, std::int64_t classes) {
    if (++*inside != 1) *overlapped = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // room for another call to come in
    ++*calls;
    --*inside;
    return bn_mlp(features, classes);
  };
  train(c, data);
  EXPECT_FALSE(*overlapped);
  EXPECT_EQ(*calls, 1 + 8) << "the plan's probe and each replica's";
}

// A user's model is named by a name of its own; a built-in name needs no factory.
TEST(UserModel, TheNameRulesAreValidated) {
  const auto data = synthetic_data(512);
  auto c = user_config(2);
  for (const std::string name : {"mlp", "cnn"}) {
    c.model = name;
    expect_refused(c, data, "TrainConfig::model must name it: '" + name + "' is a built-in model's name");
  }
  c.model = "";
  expect_refused(c, data, "TrainConfig::model must name it: it is empty");
  c.model = "bn-mlp";
  c.model_factory = nullptr;
  expect_refused(c, data, "unknown --model 'bn-mlp'; the choices are: mlp, cnn (or a model of your own");
  // --model cnn's 28x28 check is the built-in CNN's: a user's model takes the data it was built for.
  c = user_config(2);
  c.model = "my-cnn";
  c.steps = 2;
  EXPECT_EQ(train(c, data).steps, 2);
}

}  // namespace
}  // namespace lockstep::train
