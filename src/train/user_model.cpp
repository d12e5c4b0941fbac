// A model of the user's own (TrainConfig::model_factory): its name, and the
// checks that make it as safe to train as a built-in one.
//
// Note [A model of the user's own]
// A built-in model is a pure function of the config; a factory is the
// user's code, and may build another model on another call (a counter, a
// random width) or on another process. Every replica's model must be the
// one the run planned: the result's layout, the initial weights' size, the
// bucket plan and the checkpoints all come from the plan's probe, the
// factory's first call. So train() and train_replica() hand the replicas a
// wrapped factory that compares each model with the probe and refuses any
// other (InvalidArgument); a single replica has no peer in the handshake to
// catch it. Between processes, the start-up handshake compares the models'
// layers, parameters, buffers and names. The wrapper also serialises the
// calls, so a factory need not be thread-safe although the replicas of
// train() build their models on their own threads.
#include "user_model.h"

#include <mutex>

#include "lockstep/error.h"

namespace lockstep::train::detail {
namespace {

std::string tensor_text(const nn::TensorSpec& t) {
  std::string s = "'" + t.name + "' [";
  for (std::size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

// How `layout` differs from `first`'s tensors, called `what`; "" if not.
std::string layout_difference(const nn::Layout& layout, const nn::Layout& first, const std::string& what) {
  const auto& mine = layout.tensors();
  const auto& theirs = first.tensors();
  for (std::size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
    const std::string here = i < mine.size() ? tensor_text(mine[i]) : "missing";
    const std::string there = i < theirs.size() ? tensor_text(theirs[i]) : "missing";
    if (here != there)
      return what + " " + std::to_string(i) + " is " + here + " here and " + there + " in the first";
  }
  return "";
}

}  // namespace

void check_model_name(const TrainConfig& c) {
  const bool built_in = c.model == "mlp" || c.model == "cnn";
  if (!c.model_factory && !built_in) {
    throw InvalidArgument(
        "unknown --model '" + c.model +
        "'; the choices are: mlp, cnn (or a model of your own: set TrainConfig::model_factory "
        "and name it in TrainConfig::model)");
  }
  if (c.model_factory && (built_in || c.model.empty())) {
    throw InvalidArgument(
        "TrainConfig::model_factory builds a model of your own, and TrainConfig::model must name it: " +
        (c.model.empty() ? std::string("it is empty")
                         : "'" + c.model + "' is a built-in model's name, which it would pass for") +
        ". Give another name, or leave model_factory empty for the built-in " +
        (c.model.empty() ? std::string("mlp or cnn") : c.model) + ".");
  }
}

std::string model_difference(const nn::Model& model, const nn::Model& first) {
  if (model.describe() != first.describe())
    return "its layers are " + model.describe() + " here and " + first.describe() + " in the first";
  const std::string params = layout_difference(model.layout(), first.layout(), "parameter");
  return !params.empty() ? params : layout_difference(model.buffer_layout(), first.buffer_layout(), "buffer");
}

ModelFactory one_call_at_a_time(const TrainConfig& c, const nn::Model& first) {
  auto mutex = std::make_shared<std::mutex>();
  return [factory = c.model_factory, name = c.model, mutex, &first](std::int64_t features,
                                                                    std::int64_t classes) {
    std::unique_ptr<nn::Model> model;
    {
      const std::lock_guard lock(*mutex);
      model = factory(features, classes);
    }
    const std::string differs = model ? model_difference(*model, first) : "";
    if (!differs.empty()) {
      throw InvalidArgument("TrainConfig::model_factory built another model for a replica of '" + name +
                            "' than on its first call: " + differs +
                            ". It must build the same layers, parameters and buffers every call.");
    }
    return model;  // null: make_model says so
  };
}

}  // namespace lockstep::train::detail
