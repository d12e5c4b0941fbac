#include "lockstep/train/checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "lockstep/error.h"
#include "guards.h"
#include "lockstep/nn/safetensors.h"
#include "replica.h"

namespace lockstep::train {
namespace {

constexpr const char* kFormat = "lockstep-checkpoint";
constexpr const char* kOptimizerPrefix = "optimizer.";
// State that differs by replica: "replica.<r>.<buffer>" (--bn-stats local)
// and "error_feedback.<r>.<parameter>" (--compress bf16).
constexpr const char* kReplicaPrefix = "replica.";
constexpr const char* kErrorFeedbackPrefix = "error_feedback.";

std::string per_replica(const char* prefix, std::size_t r) { return prefix + std::to_string(r) + "."; }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::int64_t metadata_count(const std::filesystem::path& path, const std::map<std::string, std::string>& m,
                            const std::string& key) {
  const auto it = m.find(key);
  std::int64_t v = -1;
  if (it != m.end()) {
    try {
      std::size_t used = 0;
      v = std::stoll(it->second, &used);
      if (used != it->second.size()) v = -1;
    } catch (const std::exception&) {
      v = -1;
    }
  }
  if (v < 0) throw IoError(path.string() + ": the checkpoint's metadata lacks a valid '" + key + "'.");
  return v;
}

}  // namespace

// The tensors of `file` that `config`'s model (and, if optimizer_too, its
// optimizer) needs, into `out`; IoError names a missing, mis-shaped, extra or
// non-finite one. (Declared here, defined after load_checkpoint.)
static LoadedCheckpoint read_checkpoint_tensors(const std::filesystem::path& path, const nn::SafetensorsFile& file,
                                         const TrainConfig& config, const data::ImageClassificationData& data,
                                         LoadedCheckpoint out, bool optimizer_too);

LoadedCheckpoint load_checkpoint_weights(const std::filesystem::path& path, const TrainConfig& config,
                                         const data::ImageClassificationData& data) {
  return read_checkpoint_tensors(path, nn::load_safetensors(path), config, data, {}, /*optimizer_too=*/false);
}

bool is_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;  // a FIFO would block the open: only regular files are read
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  unsigned char size_bytes[8];
  if (!in.read(reinterpret_cast<char*>(size_bytes), 8)) return false;
  std::uint64_t size = 0;
  for (int i = 7; i >= 0; --i) size = size << 8 | size_bytes[i];  // little-endian
  if (size > nn::kMaxSafetensorsHeaderBytes) return false;
  std::string header(size, '\0');
  if (!in.read(header.data(), std::streamsize(size))) return false;
  const auto j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("__metadata__") || !j["__metadata__"].is_object()) return false;
  const auto& m = j["__metadata__"];
  return m.contains("format") && m["format"] == kFormat;
}

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& cp,
                     const std::vector<std::pair<std::string, std::string>>& fields, const std::string& model) {
  LOCKSTEP_REQUIRE(cp.layout != nullptr && cp.buffer_layout != nullptr, "save_checkpoint: no layout");
  const nn::Layout& layout = *cp.layout;
  LOCKSTEP_REQUIRE(cp.optimizer_state.size() == cp.slot_names.size() * layout.numel(),
                   "save_checkpoint: optimizer state of " + std::to_string(cp.optimizer_state.size()) + " floats");
  std::vector<nn::TensorRef> refs;
  for (const auto& t : layout.tensors()) refs.push_back({t.name, t.shape, cp.params.subspan(t.offset, t.numel)});
  for (const auto& t : cp.buffer_layout->tensors())
    refs.push_back({t.name, t.shape, cp.buffers.subspan(t.offset, t.numel)});
  for (std::size_t s = 0; s < cp.slot_names.size(); ++s) {
    const auto slot = cp.optimizer_state.subspan(s * layout.numel(), layout.numel());
    for (const auto& t : layout.tensors())
      refs.push_back({kOptimizerPrefix + cp.slot_names[s] + "." + t.name, t.shape, slot.subspan(t.offset, t.numel)});
  }
  // Replica r's copy of `layout` at r x layout.numel() of `all`, under prefix.r.
  const auto add_per_replica = [&](const char* prefix, const nn::Layout& l, std::span<const float> all) {
    LOCKSTEP_REQUIRE(l.numel() > 0 ? all.size() % l.numel() == 0 : all.empty(),
                     std::string("save_checkpoint: ") + prefix + " of " + std::to_string(all.size()) + " floats");
    for (std::size_t r = 0; l.numel() > 0 && r < all.size() / l.numel(); ++r)
      for (const auto& t : l.tensors())
        refs.push_back({per_replica(prefix, r) + t.name, t.shape, all.subspan(r * l.numel() + t.offset, t.numel)});
  };
  add_per_replica(kReplicaPrefix, *cp.buffer_layout, cp.replica_buffers);
  add_per_replica(kErrorFeedbackPrefix, layout, cp.error_feedback);
  nlohmann::json trajectory = nlohmann::json::object();
  for (const auto& [name, value] : fields) trajectory[name] = value;
  nn::save_safetensors(path, refs,
                       {{"format", kFormat},
                        {"version", "1"},
                        {"steps_done", std::to_string(cp.steps_done)},
                        {"steps_planned", std::to_string(cp.steps_planned)},
                        {"optimizer_steps", std::to_string(cp.optimizer_steps)},
                        {"skips_in_a_row", std::to_string(cp.skips_in_a_row)},
                        {"model", model},
                        {"trajectory", trajectory.dump()}},
                       "the checkpoint of step " + std::to_string(cp.steps_done));
}

// Note [Checkpoints in the background]
// A checkpoint is written by rank 0 inside a step, and every other replica
// waits for it at the next collective. Written there, the default MLP's
// 5.4 MB took ~11 ms (strace: half of it the fsync that makes the rename
// safe), more than a step, every --checkpoint-every steps. The replicas need
// not wait: the state is copied, and a thread of the writer's writes the copy
// while they train on (docs/results.md, "What a checkpoint costs": ~12 ms a
// checkpoint in the step, ~3.4 ms so). The file still appears whole or not at all, and
// only after its data is on disk; what changes is when. A failure of rank 0's
// process between the copy and the rename leaves the checkpoint before it,
// whole, and a restart goes on from there, bit for bit, a few more steps back.
// One write at a time, so the copy is made once and reused, and a disk
// slower than the checkpoints makes rank 0 wait, as before, not pile up
// copies. A write that fails is reported at the next checkpoint, or when the
// run ends (finish), and the run fails with it as a failed write in the step
// did.
struct CheckpointWriter::Staged {
  Checkpoint checkpoint;  // its spans point into the vectors below
  nn::Layout layout, buffer_layout;
  std::vector<float> params, buffers, optimizer_state, replica_buffers, error_feedback;
};

CheckpointWriter::CheckpointWriter(std::filesystem::path path,
                                   std::vector<std::pair<std::string, std::string>> fields, std::string model)
    : path_(std::move(path)), fields_(std::move(fields)), model_(std::move(model)),
      staged_(std::make_unique<Staged>()) {}

CheckpointWriter::~CheckpointWriter() {
  if (writing_.valid()) writing_.wait();  // its error, if any, is finish()'s to report
}

void CheckpointWriter::write(const Checkpoint& cp) {
  finish();  // the copy below is the one being written
  LOCKSTEP_REQUIRE(cp.layout != nullptr && cp.buffer_layout != nullptr, "CheckpointWriter::write: no layout");
  Staged& s = *staged_;
  const auto copy = [](std::span<const float> from, std::vector<float>& to) {
    to.assign(from.begin(), from.end());
    return std::span<const float>(to);
  };
  s.layout = *cp.layout;
  s.buffer_layout = *cp.buffer_layout;
  s.checkpoint = cp;
  s.checkpoint.layout = &s.layout;
  s.checkpoint.buffer_layout = &s.buffer_layout;
  s.checkpoint.params = copy(cp.params, s.params);
  s.checkpoint.buffers = copy(cp.buffers, s.buffers);
  s.checkpoint.optimizer_state = copy(cp.optimizer_state, s.optimizer_state);
  s.checkpoint.replica_buffers = copy(cp.replica_buffers, s.replica_buffers);
  s.checkpoint.error_feedback = copy(cp.error_feedback, s.error_feedback);
  writing_ = std::async(std::launch::async, [this] { save_checkpoint(path_, staged_->checkpoint, fields_, model_); });
}

void CheckpointWriter::finish() {
  if (writing_.valid()) writing_.get();  // rethrows the write's error
}

LoadedCheckpoint load_checkpoint(const std::filesystem::path& path, const TrainConfig& config,
                                 const data::ImageClassificationData& data) {
  const nn::SafetensorsFile file = nn::load_safetensors(path);
  const auto format = file.metadata.find("format");
  if (format == file.metadata.end() || format->second != kFormat) {
    throw IoError(path.string() + " is not a lockstep checkpoint (its metadata has no format '" + kFormat +
                  "'); --resume takes a file written by --checkpoint. For weights alone, use --init.");
  }
  if (const auto v = file.metadata.find("version"); v == file.metadata.end() || v->second != "1") {
    throw IoError(path.string() + ": checkpoint version " +
                  (v == file.metadata.end() ? std::string("(none)") : "'" + v->second + "'") +
                  " is not one this build reads (1); resume it with the lockstep build that wrote it, or start "
                  "afresh without --resume.");
  }
  LoadedCheckpoint out;
  out.steps_done = metadata_count(path, file.metadata, "steps_done");
  out.steps_planned = metadata_count(path, file.metadata, "steps_planned");
  out.optimizer_steps = metadata_count(path, file.metadata, "optimizer_steps");
  // Recorded since 2026-12: an older file's run resumes counting from 0, as it did.
  if (file.metadata.contains("skips_in_a_row"))
    out.skips_in_a_row = metadata_count(path, file.metadata, "skips_in_a_row");
  try {
    const auto t = nlohmann::json::parse(file.metadata.at("trajectory"));
    for (const auto& [name, value] : t.items()) out.fields.emplace_back(name, value.get<std::string>());
  } catch (const std::exception&) {
    throw IoError(path.string() + ": the checkpoint's metadata lacks a valid 'trajectory' (a JSON object of "
                  "strings).");
  }

  out.path = path;
  return read_checkpoint_tensors(path, file, config, data, std::move(out), /*optimizer_too=*/true);
}

static LoadedCheckpoint read_checkpoint_tensors(const std::filesystem::path& path, const nn::SafetensorsFile& file,
                                         const TrainConfig& config, const data::ImageClassificationData& data,
                                         LoadedCheckpoint out, bool optimizer_too) {
  const auto model = make_model(config, data.train.features, data.train.num_classes);
  const auto optimizer = make_optimizer(config, model->layout().numel());
  std::map<std::string, const nn::TensorData*> by_name;
  for (const auto& d : file.tensors) by_name[d.name] = &d;
  std::size_t used = 0;
  // Each tensor of `layout` under prefix + its name, into `into` at its offset.
  // A tensor missing from a replica's part (`part_of_replica`) means damage:
  // the part's first tensor was there.
  const auto read = [&](const nn::Layout& layout, const std::string& prefix, std::span<float> into,
                        bool part_of_replica = false) {
    for (const auto& t : layout.tensors()) {
      const auto it = by_name.find(prefix + t.name);
      if (it == by_name.end()) {
        throw IoError(path.string() + ": tensor '" + prefix + t.name + "' " + shape_text(t.shape) + " is missing; " +
                      (part_of_replica ? "each replica's part holds every tensor, so the file is damaged. Resume "
                                         "from an earlier one."
                                       : "the checkpoint is of another model or optimizer (--model, --hidden, "
                                         "--optimizer)."));
      }
      if (it->second->shape != t.shape) {
        throw IoError(path.string() + ": tensor '" + prefix + t.name + "' has shape " +
                      shape_text(it->second->shape) + " but the model needs " + shape_text(t.shape) +
                      "; the checkpoint is of another model (--model, --hidden) or data set.");
      }
      for (const float v : it->second->data) {
        if (!std::isfinite(v)) {
          throw IoError(path.string() + ": tensor '" + prefix + t.name +
                        "' holds NaN or infinite values; the checkpoint is damaged, or of a run that had diverged. "
                        "Resume from an earlier one.");
        }
      }
      std::copy(it->second->data.begin(), it->second->data.end(), into.begin() + std::ptrdiff_t(t.offset));
      ++used;
    }
  };
  out.params.resize(model->layout().numel());
  read(model->layout(), "", out.params);
  out.buffers.resize(model->buffer_layout().numel());
  read(model->buffer_layout(), "", out.buffers);
  const auto slots = optimizer_too ? optimizer->slot_names() : std::vector<std::string>{};
  out.optimizer_state.resize(slots.size() * model->layout().numel());
  for (std::size_t s = 0; s < slots.size(); ++s) {
    read(model->layout(), kOptimizerPrefix + slots[s] + ".",
         std::span(out.optimizer_state).subspan(s * model->layout().numel(), model->layout().numel()));
  }
  // Per-replica state: replicas 0, 1, ... for as long as the file names a
  // tensor of the next one, each read whole (a missing tensor is named); any
  // other tensor under the prefix is named below. resume_from compares the
  // count with the run's replicas.
  const auto replica_of = [](const std::string& name, const char* prefix) -> std::optional<std::size_t> {
    const std::string p = prefix;
    if (name.rfind(p, 0) != 0) return std::nullopt;
    std::size_t r = 0, i = p.size();
    for (; i < name.size() && i < p.size() + 6 && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
      r = r * 10 + std::size_t(name[i] - '0');
    if (i == p.size() || i >= name.size() || name[i] != '.') return std::nullopt;
    return r;
  };
  const auto read_per_replica = [&](const char* prefix, const nn::Layout& layout, std::vector<float>& into) {
    if (!optimizer_too || layout.tensors().empty()) return;
    std::set<std::size_t> named;
    for (const auto& d : file.tensors)
      if (const auto r = replica_of(d.name, prefix)) named.insert(*r);
    for (std::size_t r = 0; named.contains(r); ++r) {
      into.resize((r + 1) * layout.numel());
      read(layout, per_replica(prefix, r), std::span(into).subspan(r * layout.numel(), layout.numel()),
           /*part_of_replica=*/true);
    }
  };
  read_per_replica(kReplicaPrefix, model->buffer_layout(), out.replica_buffers);
  read_per_replica(kErrorFeedbackPrefix, model->layout(), out.error_feedback);
  // Whether `name` is replica r's copy of a tensor of `layout` that was read.
  const auto per_replica_known = [&](const std::string& name, const char* prefix, const nn::Layout& layout,
                                     const std::vector<float>& read_into) {
    const auto r = replica_of(name, prefix);
    return r && layout.numel() > 0 && (*r + 1) * layout.numel() <= read_into.size() &&
           layout.find(name.substr(per_replica(prefix, *r).size())) != nullptr;
  };
  if (used != file.tensors.size()) {
    for (const auto& d : file.tensors) {
      const bool known = model->layout().find(d.name) != nullptr || model->buffer_layout().find(d.name) != nullptr ||
                         (!optimizer_too && (d.name.rfind(kOptimizerPrefix, 0) == 0 ||
                                             d.name.rfind(kReplicaPrefix, 0) == 0 ||
                                             d.name.rfind(kErrorFeedbackPrefix, 0) == 0)) ||
                         per_replica_known(d.name, kReplicaPrefix, model->buffer_layout(), out.replica_buffers) ||
                         per_replica_known(d.name, kErrorFeedbackPrefix, model->layout(), out.error_feedback) ||
                         std::any_of(slots.begin(), slots.end(), [&](const std::string& s) {
                           return d.name.rfind(kOptimizerPrefix + s + ".", 0) == 0;
                         });
      if (!known && optimizer_too &&
          (d.name.rfind(kReplicaPrefix, 0) == 0 || d.name.rfind(kErrorFeedbackPrefix, 0) == 0)) {
        const bool buffers = d.name.rfind(kReplicaPrefix, 0) == 0;
        const std::size_t parts = (buffers ? out.replica_buffers.size() : out.error_feedback.size()) /
                                  std::max<std::size_t>(1, (buffers ? model->buffer_layout() : model->layout()).numel());
        throw IoError(path.string() + ": tensor '" + d.name + "' does not belong to the per-replica state the file " +
                      "holds (" + (parts == 0 ? std::string("none") : "replicas 0 to " + std::to_string(parts - 1)) +
                      ", each with every " + (buffers ? "buffer" : "parameter") +
                      " of the model); the file is damaged. Resume from an earlier one.");
      }
      if (!known) {
        throw IoError(path.string() + ": tensor '" + d.name +
                      "' is not part of this model or optimizer; the checkpoint is of another run (--model, "
                      "--hidden, --optimizer).");
      }
    }
  }
  return out;
}

void resume_from(TrainConfig& config, const data::ImageClassificationData& data, LoadedCheckpoint cp,
                 const std::string& transport, IfEnded ended) {
  const auto mine = trajectory_fields(config, data, transport);
  std::map<std::string, std::string> theirs(cp.fields.begin(), cp.fields.end());
  // Every setting that differs, each with both values (so that one run of
  // the command shows them all): "--lr ('0.1' there, '0.05' here)".
  std::vector<std::pair<std::string, std::string>> differ;  // name, " ('was' there, 'is' here)" or "".
  // Settings added after checkpoints were first written: a file from before
  // holds none of them, and its run had each one's default.
  static const std::map<std::string, std::string> kDefaultWhenUnrecorded = {{"--lr-warmup", "0"},
                                                                            {"--clip-grad-norm", "off"}};
  for (const auto& [name, value] : mine) {
    const auto it = theirs.find(name);
    const auto default_value = kDefaultWhenUnrecorded.find(name);
    const std::string was = it != theirs.end()                         ? it->second
                            : default_value != kDefaultWhenUnrecorded.end() ? default_value->second
                                                                            : "(not recorded)";
    if (was == value) continue;
    // Floats are recorded exactly, in hex ("0x1.99999ap-4"): shown as decimals.
    const auto readable = [](const std::string& v) {
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (v.rfind("0x", 0) != 0 || end == v.c_str() || *end != '\0') return v;
      char text[32];
      std::snprintf(text, sizeof text, "%.7g", d);  // the flags are floats
      return std::string(text);
    };
    const bool long_text = was.size() > 60 || value.size() > 60 || was.find('\n') != std::string::npos;
    differ.emplace_back(name, long_text ? "" : " ('" + readable(was) + "' there, '" + readable(value) + "' here)");
  }
  // The loop above reads this run's fields only, and a built-in model records
  // no name: a checkpoint of a user's model (model_factory) would pass for
  // the built-in one of the same layers, whose code it need not share.
  if (const auto it = theirs.find(detail::kUserModelNameField); it != theirs.end() && !config.model_factory) {
    differ.emplace_back(it->first, " ('" + it->second + "' there, the built-in --model " + config.model + " here)");
  }
  if (!differ.empty()) {
    constexpr std::size_t kShown = 6;
    std::string listed;
    for (std::size_t i = 0; i < std::min(differ.size(), kShown); ++i)
      listed += (i ? "; " : "") + differ[i].first + differ[i].second;
    if (differ.size() > kShown) listed += "; and " + std::to_string(differ.size() - kShown) + " more";
    const std::string what =
        differ.size() == 1
            ? differ[0].first + " differs from the run that wrote the checkpoint" + differ[0].second
            : std::to_string(differ.size()) + " settings differ from the run that wrote the checkpoint: " + listed;
    throw InvalidArgument("--resume: " + what +
                          "; a resumed run keeps the settings that shape its weights. Give the same, or start afresh "
                          "without --resume.");
  }
  if (cp.steps_done >= cp.steps_planned && ended == IfEnded::Refuse) {
    throw InvalidArgument("--resume: the checkpoint is of a run that had ended (step " +
                          std::to_string(cp.steps_done) + " of " + std::to_string(cp.steps_planned) +
                          "); for its weights, use --init.");
  }
  // Each replica's part of what the replicas hold differently, for as many
  // replicas as this run has: the settings are the writer's by now, so a
  // part missing (or one too many) means a damaged file.
  const auto model = make_model(config, data.train.features, data.train.num_classes);
  const std::string wrong =
      detail::replica_parts_mismatch(config, *model, cp.replica_buffers.size(), cp.error_feedback.size());
  if (!wrong.empty()) {
    throw IoError(cp.path.string() + ": the checkpoint holds " + wrong +
                  ", as the run that wrote it did; the file is damaged. Resume from an earlier one.");
  }
  config.start_step = cp.steps_done;
  config.initial_params = std::move(cp.params);
  if (!cp.buffers.empty()) config.initial_buffers = std::move(cp.buffers);  // a model without buffers: none
  config.initial_optimizer_state = std::move(cp.optimizer_state);
  config.initial_optimizer_steps = cp.optimizer_steps;
  config.initial_skips_in_a_row = cp.skips_in_a_row;
  // train() checks that there is one part for each replica.
  config.initial_replica_buffers = cp.replica_buffers.empty()
                                       ? nullptr
                                       : std::make_shared<const std::vector<float>>(std::move(cp.replica_buffers));
  config.initial_error_feedback = cp.error_feedback.empty()
                                      ? nullptr
                                      : std::make_shared<const std::vector<float>>(std::move(cp.error_feedback));
}

}  // namespace lockstep::train
