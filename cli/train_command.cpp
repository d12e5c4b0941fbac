// `lockstep train`: flags -> TrainConfig -> train() -> summary, report, weights.
// With --backend gloo|mpi this process is one rank of a group of processes
// (train_replica()); rank 0 alone prints and writes files.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <tuple>
#include <memory>
#include <optional>
#include <sstream>

#include "checks.h"
#include "commands.h"
#include "host_memory.h"
#include "lockstep/cost/models.h"
#include "lockstep/cost/plan.h"
#include "lockstep/cost/profile.h"
#include "lockstep/error.h"
#include "lockstep/nn/weights_file.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/report.h"
#include "median.h"
#include "output_files.h"
#include "stop_on_signal.h"
#include "lockstep/comm/collectives.h"
#include "peak_flops.h"
#include "process_group_flags.h"

namespace lockstep::cli {
namespace {

struct TrainFlags {
  train::TrainConfig config;
  std::string data_dir = data::default_data_dir().string();
  std::string hidden = "512,512";
  std::string shuffle = "on";
  std::string schedule = "cosine";
  std::string ragged = "weighted";
  std::string bn_stats = "local";
  std::string algorithm = "auto";
  std::string compress = "none";
  std::string overlap = "auto";
  std::string link_bandwidth, link_latency;
  std::string on_divergence = "stop";
  std::vector<std::string> inject;
  std::string trace_file, svg_file, profile_file;
  std::int64_t svg_step = -1;
  double timeout_s = 60;
  double peak_gflops = 0;  // --peak-gflops: one host's; 0 = measure it
  bool normalize = false;
  bool quiet = false;
  std::string init_file, save_file, report_file;
  std::string checkpoint_file, resume_file;
  bool auto_resume = false;   // --auto-resume: resume_file = checkpoint_file when that exists
  bool auto_resumed = false;  // ... and it did
  std::int64_t restart = 0;   // LOCKSTEP_RESTART_COUNT: Note [Restarts]
  std::optional<train::LoadedCheckpoint> resume;  // read from resume_file before any rendezvous
  CLI::Option* lr_option = nullptr;
  CLI::Option* weight_decay_option = nullptr;
  CLI::Option* hidden_option = nullptr;
  CLI::Option* momentum_option = nullptr;
  CLI::Option* steps_option = nullptr;
  CLI::Option* epochs_option = nullptr;
  ProcessGroupFlags group;  // --backend and the process-group flags
  CLI::Option* replicas_option = nullptr;
  const CLI::App* cmd = nullptr;  // which flags were given
};

struct ModelSize {
  double params = 0;
  double activation_floats = 0;  // per sample
};

// The MLP counted by the cost model (as lockstep plan counts it), not built:
// a probe model would itself zero gigabytes first. The built-in CNN is small:
// built, and counted as Model keeps it per sample, every layer's output and
// two buffers of upstream gradients as wide as the widest (~350 KB).
ModelSize model_size(const train::TrainConfig& c, const data::ImageClassificationData& data) {
  ModelSize size;
  if (c.model == "mlp") {
    const cost::ModelSpec spec = cost::mlp_model(data.train.features, c.hidden, data.train.num_classes);
    size.params = spec.params();
    for (const cost::LayerShape& l : spec.layers) size.activation_floats += l.activation_floats;
    return size;
  }
  const auto model = train::make_model(c, data.train.features, data.train.num_classes);
  size.params = double(model->layout().numel());
  double widest = 0;
  for (std::size_t i = 0; i < model->layer_count(); ++i) {
    const auto out = double(model->layer(i).out_features());
    size.activation_floats += out;
    widest = std::max(widest, out);
  }
  size.activation_floats += 2 * widest;
  return size;
}

// Per-layer forward and backward times of this run (medians over every
// replica and step but the run's first), for `lockstep plan --profile`.
cost::Profile measured_profile(const train::TrainConfig& c, const train::TrainResult& r,
                               const data::ImageClassificationData& data) {
  std::map<int, std::vector<double>> forward, backward;
  std::vector<double> optimizer;
  // --deterministic computes a step's micro-batches atom by atom: its events
  // are summed per replica, step and layer, and divided by --accumulate, so
  // that each time is one micro-batch's.
  std::map<std::tuple<int, std::int64_t, int, bool>, double> per_micro_batch;
  for (const auto& e : r.timeline) {
    // The run's first step warms up (a resumed run's too): left out.
    const bool first = e.step == r.resumed_from_step;
    if (!first && e.phase == train::Phase::Optimizer) optimizer.push_back((e.end_us - e.start_us) / 1000);
    if (e.layer < 0 || first) continue;
    const bool fwd = e.phase == train::Phase::Forward;
    const double ms = (e.end_us - e.start_us) / 1000;
    if (c.deterministic)
      per_micro_batch[{e.replica, e.step, e.layer, fwd}] += ms;
    else
      (fwd ? forward : backward)[e.layer].push_back(ms);
  }
  for (const auto& [key, ms] : per_micro_batch)
    (std::get<3>(key) ? forward : backward)[std::get<2>(key)].push_back(ms / double(c.accumulate));
  cost::Profile p;
  p.model = r.model_description;
  p.replicas = int(r.replicas);
  p.micro_batch = r.micro_batch;
  // One micro-batch's step: with --accumulate K the step computed K of them
  // and stepped the optimizer once.
  const double optimizer_ms = optimizer.empty() ? 0 : median(optimizer);
  p.step_compute_ms = (r.times.compute_ms - optimizer_ms) / double(c.accumulate) + optimizer_ms;
  p.activation_bytes_per_sample = model_size(c, data).activation_floats * sizeof(float);
  const int layers = forward.empty() ? 0 : forward.rbegin()->first + 1;
  for (int i = 0; i < layers; ++i) {
    cost::LayerCost l{std::to_string(i), 0, median(forward[i]), median(backward[i])};
    const std::string prefix = std::to_string(i) + ".";
    for (const auto& t : r.layout.tensors())
      if (t.name.rfind(prefix, 0) == 0) l.param_bytes += double(t.numel * sizeof(float));
    p.layers.push_back(l);
  }
  return p;
}

std::vector<NamedFile> output_files(const TrainFlags& f) {
  return {{"--save", f.save_file},
          {"--report", f.report_file},
          {"--trace", f.trace_file},
          {"--timeline-svg", f.svg_file},
          {"--profile", f.profile_file},
          {"--checkpoint", f.checkpoint_file}};
}

// Fails before training, not after it, if an output cannot be written or
// would destroy another output or one of the run's inputs.
void check_outputs(const TrainFlags& f) {
  // The secret the group would read, from the flag or the environment.
  comm::ProcessGroupOptions group;
  group.rank = 0;  // not read from the environment here
  group.world_size = 1;
  group.secret_file = f.group.secret_file;
  const std::string secret = comm::with_environment(group).secret_file;
  std::vector<NamedFile> inputs = {
      {"--init", f.init_file, "--save"},
      {"--resume", f.resume_file, "--checkpoint"},  // a run goes on writing the checkpoint it went on from
      {f.group.secret_file.empty() ? "$LOCKSTEP_SECRET_FILE" : "--secret-file", secret}};
  for (const auto& file : data::image_classification_files(f.data_dir))
    inputs.push_back({"a file of --data", file.string()});
  check_outputs(output_files(f), inputs);
  if (f.svg_step >= 0 && f.svg_file.empty())
    throw InvalidArgument("--timeline-step needs --timeline-svg FILE.");
}

// Flags that would be silently ignored with the model or optimizer chosen.
void check_flag_combinations(const TrainFlags& f) {
  const auto& c = f.config;
  if (c.model != "mlp" && f.hidden_option->count() > 0)
    throw InvalidArgument("--hidden sets the widths of --model mlp and has no effect on --model " + c.model +
                          "; leave it out.");
  if (c.optimizer != "sgd" && c.nesterov)
    throw InvalidArgument("--nesterov applies to --optimizer sgd only; leave it out with --optimizer " +
                          c.optimizer + ".");
  if (c.optimizer != "sgd" && f.momentum_option->count() > 0)
    throw InvalidArgument("--momentum applies to --optimizer sgd only (adamw has its own moments); leave it "
                          "out with --optimizer " + c.optimizer + ".");
  if (f.steps_option->count() > 0 && f.epochs_option->count() > 0 && c.steps > 0)
    throw InvalidArgument("--steps and --epochs both set the length of the run; give one of them.");
  // Flags that would be ignored: refused, so that nobody believes they took effect.
  const auto given = [&](const char* flag) { return f.cmd->get_option(flag)->count() > 0; };
  for (const char* flag :
       {"--save", "--report", "--trace", "--timeline-svg", "--profile", "--init", "--checkpoint", "--resume"}) {
    if (given(flag) && f.cmd->get_option(flag)->as<std::string>().empty())
      throw InvalidArgument(std::string(flag) + " needs a file name.");
  }
  // An empty value would read as the flag not given: no link, the default data.
  for (const char* flag : {"--data", "--link-bandwidth", "--link-latency"}) {
    if (given(flag) && f.cmd->get_option(flag)->as<std::string>().empty())
      throw InvalidArgument(std::string(flag) + " needs a value; leave the flag out for its default.");
  }
  if (!c.deterministic && given("--atom"))
    throw InvalidArgument("--atom sets --deterministic's unit of summation; add --deterministic or leave it out.");
  if (c.deterministic) {
    for (const char* flag : {"--ragged", "--bucket-mb", "--first-bucket-mb", "--overlap"}) {
      if (given(flag)) {
        throw InvalidArgument(std::string("--deterministic sums the whole gradient in one fixed tree after backward "
                                          "and drops an epoch's partial last batch, so ") +
                              flag + " has no effect; leave it out.");
      }
    }
  }
  if (c.bucket_mb == 0 && given("--first-bucket-mb"))
    throw InvalidArgument("--bucket-mb 0 puts every gradient in one bucket, so --first-bucket-mb has no effect; "
                          "leave it out.");
  if (c.check_every == 0 && given("--on-divergence"))
    throw InvalidArgument("--on-divergence acts when the divergence check finds replicas apart, and --check-every 0 "
                          "turns the check off; give --check-every N or leave --on-divergence out.");
  if (c.zero == 1 && !f.profile_file.empty())
    throw InvalidArgument("--profile records the replicated step for lockstep plan, whose --zero 1 shards it itself; "
                          "run --profile without --zero 1.");
  if (c.checkpoint_every > 0 && f.checkpoint_file.empty())
    throw InvalidArgument("--checkpoint-every says how often to write --checkpoint FILE; give that too.");
  if (!f.resume_file.empty() && !f.init_file.empty()) {
    throw InvalidArgument("--resume and --init both set the starting weights (--resume takes the checkpoint's); "
                          "give one of them.");
  }
  if (f.auto_resume && f.checkpoint_file.empty())
    throw InvalidArgument("--auto-resume goes on from the file --checkpoint writes; give --checkpoint FILE too.");
  if (f.auto_resume && !f.resume_file.empty()) {
    throw InvalidArgument("--resume names the checkpoint to go on from, and --auto-resume takes --checkpoint's when "
                          "it is there; give one of them.");
  }
  if (given("--seed") && !f.init_file.empty() && !c.shuffle && c.model == "mlp") {
    throw InvalidArgument("--seed draws the initial weights, the data order and dropout, and with --init, "
                          "--shuffle off and --model mlp (no dropout) it draws none of them; leave it out.");
  }
  if (c.model == "mlp" && given("--bn-stats"))
    throw InvalidArgument("--bn-stats chooses how batch-norm statistics are kept, and --model mlp has none; leave "
                          "it out.");
  check_group_flags(*f.cmd, f.group);
}

// --timeline-step past the run's last step, found before training. The
// count is the trainer's own, so a config the trainer refuses is refused
// first with the trainer's reason.
void check_timeline_step(const TrainFlags& f, const data::ImageClassificationData& data) {
  if (f.svg_step < 0) return;
  const std::int64_t steps = train::total_steps(f.config, data);
  if (f.svg_step >= steps) {
    throw InvalidArgument("--timeline-step " + std::to_string(f.svg_step) + " is past the run's last step (" +
                          std::to_string(steps - 1) + ").");
  }
  // --auto-resume runs the same command in every run of a job: an earlier
  // run passed the step, and this one goes on without it (train_and_report
  // says so where it would have written it).
  if (f.svg_step < f.config.start_step && !f.auto_resumed) {
    throw InvalidArgument("--timeline-step " + std::to_string(f.svg_step) + " is before step " +
                          std::to_string(f.config.start_step) + ", where this run goes on from its checkpoint.");
  }
}

}  // namespace

// Every replica holds its weights, gradients and optimizer state (and, with
// --compress bf16, its error feedback and a bf16 copy), and the MLP's
// activations of a micro-batch (each Linear's input and output, a lower
// bound: backward needs as much again for their gradients). When that alone
// is more than the host has free, the run is refused now: otherwise the
// kernel's OOM killer ends it part way, without a word. The process that
// writes checkpoints also keeps a copy of one, and gathers the parts the
// replicas hold apart to make it.
void check_memory(const train::TrainConfig& c, const data::ImageClassificationData& data, int replicas_here,
                  bool checkpoint_copy) {
  const auto [params, activation_floats] = model_size(c, data);
  const char* widths = c.model == "mlp" ? " or --hidden" : "";
  const cost::Optimizer optimizer = c.optimizer == "adamw" ? cost::Optimizer::AdamW
                                    : c.momentum > 0       ? cost::Optimizer::Momentum
                                                           : cost::Optimizer::Sgd;
  const double shards = c.zero == 1 ? std::max(1, c.replicas) : 1;  // --zero 1: 1/N of the state each
  const double copies = 2 + cost::optimizer_state_factor(optimizer) / shards +
                        (c.compression == ddp::Compression::Bf16 ? 1.5 : 0);
  const double state = params * sizeof(float) * copies;
  const double activations = activation_floats * double(c.micro_batch) * sizeof(float);
  // The copy (weights, the whole optimizer state, with bf16 every replica's
  // rounding error), and what rank 0 gathers while it makes it (under --zero 1
  // the whole state, with bf16 the rounding errors).
  const double slots = cost::optimizer_state_factor(optimizer);
  const double bf16_parts = c.compression == ddp::Compression::Bf16 ? double(c.replicas) : 0;
  const double checkpoint =
      checkpoint_copy ? params * sizeof(float) * (1 + slots + bf16_parts + (c.zero == 1 ? slots : 0) + bf16_parts)
                      : 0;
  const double need = replicas_here * (state + activations) + checkpoint;
  const std::optional<double> available = available_memory_bytes();
  if (available && need > *available) {
    char text[448];
    const char* copy_text = checkpoint > 0 ? ", with a checkpoint's copy (--checkpoint)," : "";
    if (activations > state) {
      std::snprintf(text, sizeof text,
                    "this run needs at least %s for %d replicas' activations of %lld samples each (%s per replica) "
                    "and their weights, gradients and optimizer state%s on this host, and it has %s free; lower "
                    "--micro-batch or --replicas (or the processes per host)%s.",
                    show_bytes(need).c_str(), replicas_here, static_cast<long long>(c.micro_batch),
                    show_bytes(activations).c_str(), copy_text, show_bytes(*available).c_str(), widths);
    } else {
      std::snprintf(text, sizeof text,
                    "this run needs at least %s for %d replicas' weights, gradients and optimizer state (%.3g "
                    "parameters each) and activations%s on this host, and it has %s free; lower --replicas (or "
                    "the processes per host)%s.",
                    show_bytes(need).c_str(), replicas_here, params, copy_text, show_bytes(*available).c_str(),
                    widths);
    }
    throw InvalidArgument(text);
  }
}

namespace {

// The ranks of a process group on this host: LOCAL_WORLD_SIZE (or mpirun's
// OMPI_COMM_WORLD_LOCAL_SIZE) when set, else the ranks the group found on
// this rank's node (its host name and address), else the whole group.
int ranks_on_this_host(const comm::Communicator& group) {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    const char* env = std::getenv(name);
    if (env != nullptr && *env != '\0') return train::local_world_size(group.size());
  }
  const std::vector<int> nodes = group.nodes();
  if (nodes.size() != static_cast<std::size_t>(group.size())) return group.size();
  const int mine = nodes[static_cast<std::size_t>(group.rank())];
  return static_cast<int>(std::count(nodes.begin(), nodes.end(), mine));
}

// Note [Restarts]
// `lockstep launch --max-restarts N` starts a failed job again, every rank,
// with LOCKSTEP_RESTART_COUNT = 1, 2, ... (torchrun's
// TORCHELASTIC_RESTART_COUNT). A restart stands for recovery from a
// transient failure (a killed process, a lost host), so faults injected with
// --inject fire in the job's first run only: `--inject throw@25:1
// --max-restarts 1` shows a failure recovered from, where injecting it again
// would fail every restart alike. Every rank has the same count, so they
// agree (--inject is a handshake field).
//
// --auto-resume goes on from --checkpoint's file when it is there, and starts
// afresh when it is not: the one command a restarted job (or a scheduler's
// requeue) runs every time. Resumed runs end as the unbroken run would, bit
// for bit, so a job restarted from its last checkpoint ends with the weights
// of a job that never failed; what a restart costs is the steps since that
// checkpoint. Every rank looks for the file itself: across hosts it must be
// on a shared filesystem (a rank that finds another step than rank 0, or
// none, is refused, naming the file and both steps:
// check_auto_resume_agrees).
std::int64_t restart_count() {
  const char* env = std::getenv("LOCKSTEP_RESTART_COUNT");
  if (env == nullptr || *env == '\0') return 0;
  const std::string text = env;
  if (text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos) {
    throw InvalidArgument("LOCKSTEP_RESTART_COUNT is '" + text +
                          "', not a whole number; it is lockstep launch's count of restarts, so unset it.");
  }
  return std::stoll(text);
}

void take_restart(TrainFlags& f) {
  f.restart = restart_count();
  if (f.restart > 0) f.config.inject.clear();  // Note [Restarts]
  if (!f.auto_resume) return;
  std::error_code ec;  // a file that cannot be looked at is taken as there: reading it says why
  if (!std::filesystem::exists(f.checkpoint_file, ec) && !ec) return;
  f.resume_file = f.checkpoint_file;
  f.auto_resumed = true;
  f.init_file.clear();  // the checkpoint holds the weights the run reached from it
}

// The flag that gave the checkpoint a run goes on from, for its messages.
std::string resume_flag(const TrainFlags& f) { return f.auto_resumed ? "--auto-resume" : "--resume"; }

// resume_from's refusal of the file --auto-resume found, with the remedies
// that flag has: a run that must start afresh needs another --checkpoint
// file (there is no --resume to leave out).
std::string auto_resume_refusal(const std::string& file, std::string why) {
  const auto replace = [&](const std::string& from, const std::string& to) {
    if (const auto at = why.find(from); at != std::string::npos) why.replace(at, from.size(), to);
  };
  replace("--resume: ", "");
  replace("start afresh without --resume", "give another --checkpoint file to start afresh");
  return "--auto-resume found " + file + ", and cannot go on from it: " + why;
}

// A rank's error names the rank, and reaches the other ranks at once (abort).
[[noreturn]] void rethrow_as_rank(comm::Communicator& group) {
  const std::string rank = "rank " + std::to_string(group.rank());
  const auto named = [&](const std::string& what) {
    return what.rfind(rank + ":", 0) == 0 || what.rfind(rank + " ", 0) == 0 ? what : rank + ": " + what;
  };
  try {
    throw;
  } catch (const CommAborted& e) {
    throw CommAborted(named(e.what()));  // another rank's failure: the group knows already
  } catch (const InvalidArgument& e) {
    if (!group.aborted()) group.abort(named(e.what()));
    throw InvalidArgument(named(e.what()));
  } catch (const TimeoutError& e) {  // main() says what to do about it
    if (!group.aborted()) group.abort(named(e.what()));
    throw TimeoutError(named(e.what()));
  } catch (const std::exception& e) {
    if (!group.aborted()) group.abort(named(e.what()));
    throw Error(named(e.what()));
  }
}

class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) == 1) {}
  void operator()(const train::Progress& p) {
    if (quiet_) return;
    char line[256];
    std::snprintf(line, sizeof line,
                  "epoch %lld  step %lld/%lld  loss %.4f  lr %.4g  %.0f samples/s  step %.1f ms (comm %.1f, "
                  "exposed %.1f)",
                  (long long)p.epoch + 1, (long long)p.step, (long long)p.total_steps, p.loss, p.lr,
                  p.samples_per_s, p.times.step_ms, p.times.comm_ms, p.times.exposed_comm_ms);
    if (p.grad_norm) {  // --clip-grad-norm
      const std::size_t used = std::strlen(line);
      std::snprintf(line + used, sizeof line - used, "  grad norm max %.3g (clipped %lld)", *p.grad_norm,
                    (long long)p.clipped);
    }
    // On a terminal one line is rewritten in place; elsewhere every update is a line.
    if (tty_) std::fprintf(stderr, "\r\033[K%s", line);
    if (p.test_accuracy) {
      std::fprintf(stderr, "%s  test accuracy %.4f\n", tty_ ? "" : line, *p.test_accuracy);
    } else if (!tty_) {
      std::fprintf(stderr, "%s\n", line);
    }
    std::fflush(stderr);
  }

 private:
  bool quiet_;
  bool tty_;
};

int train_as_rank(TrainFlags& f, const data::ImageClassificationData& data);
int train_and_report(TrainFlags& f, const data::ImageClassificationData& data, comm::Communicator* group);

int run_train(TrainFlags& f) {
  auto& c = f.config;
  c.hidden = parse_hidden(f.hidden);
  c.shuffle = f.shuffle == "on";
  c.schedule = f.schedule == "cosine" ? optim::Schedule::Cosine : optim::Schedule::Constant;
  c.ragged = train::ragged_from_string(f.ragged);
  c.bn_stats = train::bn_stats_from_string(f.bn_stats);
  c.algorithm = comm::algorithm_from_string(f.algorithm);
  c.compression = f.compress == "bf16" ? ddp::Compression::Bf16 : ddp::Compression::None;
  c.overlap = f.overlap == "on"    ? train::Overlap::On
              : f.overlap == "off" ? train::Overlap::Off
                                   : train::Overlap::Auto;
  if (!f.link_bandwidth.empty()) c.link.bytes_per_second = comm::parse_bandwidth(f.link_bandwidth);
  if (!f.link_latency.empty()) c.link.latency = comm::parse_latency(f.link_latency);
  if (c.link.enabled() && backend_of(f.group) != comm::Backend::Threads) {  // before the rendezvous, not after
    throw InvalidArgument("a modelled link (--link-bandwidth/--link-latency) is for the threads backend; a " +
                          f.group.backend + " process group has real links. Leave them out.");
  }
  c.record_timeline = !f.trace_file.empty() || !f.svg_file.empty() || !f.profile_file.empty();
  if (f.lr_option->count() == 0 && c.optimizer == "adamw") c.lr = 1e-3f;
  if (f.weight_decay_option->count() == 0 && c.optimizer == "adamw") c.weight_decay = 0.01f;  // torch.optim.AdamW's
  c.on_divergence = train::on_divergence_from_string(f.on_divergence);
  for (const auto& spec : f.inject) c.inject.push_back(train::fault_from_string(spec));
  c.timeout = comm::Duration(static_cast<std::int64_t>(std::ceil(f.timeout_s * 1000)));
  const bool in_group = backend_of(f.group) != comm::Backend::Threads;
  check_flag_combinations(f);
  check_nodes(f.group, c.replicas, c.algorithm, c.link.enabled());
  if (c.zero == 1 && f.group.per_node > 0)
    throw InvalidArgument("--per-node groups replicas for the hierarchical all-reduce, and --zero 1 reduce-scatters "
                          "and all-gathers on one flat ring; leave one of them out.");
  c.ranks_per_node = f.group.per_node;
  take_restart(f);
  if (!in_group) check_outputs(f);

  // Every rank loads the data (and --init) itself, before the rendezvous:
  // no collective timeout runs yet, so a slow disk cannot trip one.
  const auto data = load_data(f.data_dir, f.normalize, in_group ? ranks_here_before_rendezvous(f.group) : 1);
  if (!f.init_file.empty()) {
    auto model = train::make_model(c, data.train.features, data.train.num_classes);
    nn::LoadedState state = [&] {
      try {
        if (train::is_checkpoint(f.init_file)) {  // its weights and buffers; the optimizer state is --resume's
          auto cp = train::load_checkpoint_weights(f.init_file, c, data);
          nn::LoadedState s{.params = std::move(cp.params)};
          if (!cp.buffers.empty()) s.buffers = std::move(cp.buffers);
          return s;
        }
        return nn::load_state(f.init_file, model->layout(), model->buffer_layout());
      } catch (const IoError& e) {  // the message names the file; say which flag gave it
        throw IoError(std::string("--init: ") + e.what());
      }
    }();
    // Training from them would give NaN from step 0.
    const auto check_finite = [&](const nn::Layout& layout, const std::vector<float>& all) {
      for (const auto& t : layout.tensors()) {
        const auto values = std::span<const float>(all).subspan(t.offset, t.numel);
        if (std::any_of(values.begin(), values.end(), [](float v) { return !std::isfinite(v); })) {
          throw InvalidArgument("--init " + f.init_file + ": tensor " + t.name +
                                " holds NaN or infinite values; no model trains from them. Give weights saved "
                                "from a healthy run.");
        }
      }
    };
    check_finite(model->layout(), state.params);
    if (state.buffers) check_finite(model->buffer_layout(), *state.buffers);
    if (!state.buffers && model->buffer_layout().numel() > 0 && !f.quiet) {
      std::fprintf(stderr,
                   "note: --init %s holds no batch-norm running statistics (saved by an earlier lockstep); they "
                   "start at mean 0 and variance 1.\n",
                   f.init_file.c_str());
    }
    c.initial_params = std::move(state.params);
    c.initial_buffers = std::move(state.buffers);
  }
  if (!f.resume_file.empty()) {  // compared with this run once the group's size is known (train_and_report)
    try {
      f.resume = train::load_checkpoint(f.resume_file, c, data);
    } catch (const IoError& e) {  // the message names the file; say which flag gave it
      throw IoError(resume_flag(f) + ": " + e.what());
    }
  }
  if (!in_group) return train_and_report(f, data, nullptr);
  return train_as_rank(f, data);
}

// Rank 0 writes a group's outputs. An output flag given to another rank
// only would be ignored without a word: that rank says so (one broadcast of
// which outputs rank 0 has, before training).
void warn_outputs_rank0_lacks(const TrainFlags& f, comm::Communicator& group) {
  const std::pair<const char*, const std::string*> outputs[] = {{"--save", &f.save_file},
                                                                {"--report", &f.report_file},
                                                                {"--trace", &f.trace_file},
                                                                {"--timeline-svg", &f.svg_file},
                                                                {"--profile", &f.profile_file},
                                                                {"--checkpoint", &f.checkpoint_file}};
  std::uint8_t mine = 0;
  for (std::size_t i = 0; i < std::size(outputs); ++i)
    if (!outputs[i].second->empty()) mine |= std::uint8_t(1u << i);
  std::uint8_t rank0 = mine;
  comm::broadcast(group, std::as_writable_bytes(std::span(&rank0, 1)), 0);
  for (std::size_t i = 0; i < std::size(outputs); ++i) {
    if ((mine & ~rank0) & (1u << i)) {
      const std::string line = "lockstep: warning: rank " + std::to_string(group.rank()) + ": " + outputs[i].first +
                               " is written by rank 0 alone, which was not given it, so nothing will be written; "
                               "give " + outputs[i].first + " to rank 0.\n";
      std::fwrite(line.data(), 1, line.size(), stderr);
    }
  }
}

// Note [Restarts]: every rank looks for --auto-resume's file itself. A rank
// that found another step than rank 0 (across hosts: a file not on a shared
// filesystem, or a stale copy) is refused here, naming the file and both
// steps; the handshake would say only that the steps differ, and to give
// every rank the same flags, which they have. One broadcast every rank joins,
// whatever its flags.
void check_auto_resume_agrees(const TrainFlags& f, comm::Communicator& group) {
  const std::int64_t mine[2] = {f.auto_resume ? 1 : 0, f.resume ? f.resume->steps_done : 0};
  std::int64_t rank0[2] = {mine[0], mine[1]};
  comm::broadcast(group, std::as_writable_bytes(std::span(rank0)), 0);
  if (!f.auto_resume || rank0[0] == 0 || rank0[1] == mine[1]) return;
  const std::string here =
      mine[1] > 0 ? "found " + f.checkpoint_file + " of step " + std::to_string(mine[1])
                  : "did not find " + f.checkpoint_file;
  const std::string there =
      rank0[1] > 0 ? "goes on from its copy after step " + std::to_string(rank0[1]) : "did not find it";
  throw InvalidArgument("--auto-resume: this rank " + here + ", and rank 0 " + there +
                        "; every rank reads the checkpoint, so across hosts it must be one file on a filesystem "
                        "every host sees.");
}

int train_as_rank(TrainFlags& f, const data::ImageClassificationData& data) {
  f.group.timeout_s = f.timeout_s;
  std::ostringstream warnings;
  const auto options = process_group_options(f.group, warnings);
  // --replicas against the world size, before the rendezvous where that is
  // known (flag or WORLD_SIZE, which process_group_options has read for gloo;
  // under mpirun, its own variable): a rank started alone would wait the
  // whole rendezvous timeout.
  const auto check_replicas = [&](int world) {
    if (f.replicas_option->count() > 0 && world > 0 && f.config.replicas != world) {
      throw InvalidArgument("--replicas " + std::to_string(f.config.replicas) + " does not match the world size " +
                            std::to_string(world) + " of the process group; leave --replicas out.");
    }
  };
  check_replicas(backend_of(f.group) == comm::Backend::Mpi ? mpirun_world_size() : options.world_size);
  const auto group = connect_group(f.group, options);
  if (group->rank() == 0) std::cerr << warnings.str() << std::flush;
  try {
    auto& c = f.config;
    check_replicas(group->size());  // where it was not known before
    c.replicas = group->size();
    if (group->rank() == 0) check_outputs(f);
    warn_outputs_rank0_lacks(f, *group);
    check_auto_resume_agrees(f, *group);
    return train_and_report(f, data, group.get());
  } catch (...) {
    rethrow_as_rank(*group);
  }
}

bool bucket_flag_given(const TrainFlags& f) {
  return f.cmd->get_option("--bucket-mb")->count() > 0 || f.cmd->get_option("--first-bucket-mb")->count() > 0;
}

// Note [One bucket on shared cores]: buckets exist so that the all-reduce
// of the last layers' gradients runs while backward computes the first
// layers'. That needs a core to run it. Where a host runs at least as many
// replicas as it has cores, every core is computing backward, so nothing
// overlaps, and each bucket past the first only adds an all-reduce's fixed
// cost: its rounds' latency, and waking the threads that wait on them.
// Measured on this 2-core machine (docs/results.md, "One bucket on shared
// cores"): over Gloo, 2 x 128 1.24x and 8 x 32 1.42x faster in one bucket;
// 8 ranks on 4 test hosts at 1 Gbit/s 1.20x; over MPI 1.02x; in process no
// change (the shared-memory all-reduce runs after backward anyway). The same
// holds for a process that may use no more cores than it runs replicas: bound
// to them (taskset; mpirun binds a rank to one core) or held to them by its
// cgroup's CPU quota (a container). So with --overlap auto and no bucket
// flag, such a run takes one bucket. A modelled link keeps the buckets: its
// delay is a sleep, not a core's work.
// Every rank takes the same decision (the bucket layout is checked across
// ranks), in one small all-reduce that every rank joins whatever its flags:
// one bucket if some host is so loaded and no rank was told otherwise (a
// bucket flag, --overlap on|off, a link), so that ranks whose flags differ
// only in ways that did not change the layout before still agree on it.
void one_bucket_if_cores_are_shared(TrainFlags& f, comm::Communicator* group, const HostCores& host) {
  auto& c = f.config;
  const bool eligible = c.overlap == train::Overlap::Auto && !c.link.enabled() && !c.deterministic &&
                        !bucket_flag_given(f) && c.replicas > 1;
  const int ranks_here = group == nullptr ? c.replicas : ranks_on_this_host(*group);
  const int replicas_in_process = group == nullptr ? c.replicas : 1;
  const bool shared = ranks_here >= host.cores || replicas_in_process >= host.process;
  // {some host's or process's cores are shared, some rank is not eligible}: one max.
  float votes[2] = {shared ? 1.0f : 0.0f, eligible ? 0.0f : 1.0f};
  if (group != nullptr) comm::allreduce(*group, std::span(votes), {.op = comm::ReduceOp::Max});
  if (votes[0] > 0 && votes[1] == 0) {
    c.bucket_mb = 0;
    c.one_bucket_on_shared_cores = true;
  }
}

// --resume with no bucket flag: the checkpoint's layout, if it is one of the
// two lockstep train takes by itself (the defaults, or one bucket), whatever
// this run's host would take. The layout shapes the weights over processes,
// and a resumed run keeps the writer's settings.
void buckets_from_checkpoint(TrainFlags& f, const data::ImageClassificationData& data) {
  auto& c = f.config;
  if (!f.resume || bucket_flag_given(f) || c.deterministic) return;
  const auto transport = comm::to_string(backend_of(f.group));
  const auto layout = [&](const std::vector<std::pair<std::string, std::string>>& fields) {
    const auto it = std::find_if(fields.begin(), fields.end(),
                                 [](const auto& field) { return field.first.rfind("bucket layout", 0) == 0; });
    return it == fields.end() ? std::string() : it->second;
  };
  const std::string theirs = layout(f.resume->fields);
  if (theirs == layout(train::trajectory_fields(c, data, transport))) return;
  for (const double bucket_mb : {train::TrainConfig{}.bucket_mb, 0.0}) {
    auto other = c;
    other.bucket_mb = bucket_mb;
    if (layout(train::trajectory_fields(other, data, transport)) == theirs) {
      c.bucket_mb = bucket_mb;
      c.one_bucket_on_shared_cores = false;
      c.buckets_from_checkpoint = true;
      return;
    }
  }
}

int train_and_report(TrainFlags& f, const data::ImageClassificationData& data, comm::Communicator* group) {
  auto& c = f.config;
  const bool rank0 = group == nullptr || group->rank() == 0;  // prints and writes files
  // Over processes, every rank on this host needs its copy.
  check_memory(c, data, group == nullptr ? c.replicas : ranks_on_this_host(*group),
               rank0 && !f.checkpoint_file.empty());
  const HostCores host = host_cores();
  c.cores = host.process;  // the replicas' BLAS threads
  one_bucket_if_cores_are_shared(f, group, host);
  const std::int64_t steps = train::total_steps(c, data);  // the trainer's own checks of the config, before seconds of measuring
  if (!f.profile_file.empty() && steps < 2) {  // its layers would be empty, and lockstep plan refuses that
    throw InvalidArgument("--profile times every step but the first (which warms up), and this run has " +
                          std::to_string(steps) + "; give --steps 2 or more.");
  }
  buckets_from_checkpoint(f, data);
  if (f.resume) {
    try {
      train::resume_from(c, data, std::move(*f.resume), comm::to_string(backend_of(f.group)),
                         f.auto_resumed ? train::IfEnded::Finish : train::IfEnded::Refuse);
    } catch (const IoError& e) {  // a damaged file, named; say which flag gave it, as when it was read
      throw IoError(resume_flag(f) + ": " + e.what());
    } catch (const InvalidArgument& e) {
      if (!f.auto_resumed) throw;
      throw InvalidArgument(auto_resume_refusal(f.checkpoint_file, e.what()));
    }
    f.resume.reset();
    // Over processes only rank 0's per-replica parts are read (it scatters
    // them): the others need not hold N of them each.
    if (!rank0) c.initial_replica_buffers = c.initial_error_feedback = nullptr;
  }
  check_timeline_step(f, data);
  // One host's sgemm peak, for MFU: stated (--peak-gflops), or measured on all cores.
  c.peak_flops_given = f.peak_gflops > 0;
  const auto host_peak = [&] { return f.peak_gflops > 0 ? f.peak_gflops * 1e9 : measure_peak_sgemm_flops(host); };
  if (group == nullptr) c.peak_flops = host_peak();
  if (!f.quiet && rank0) {
    std::fprintf(stderr, "lockstep train: %d replicas x %lld%s on %s (%lld train, %lld test samples)\n",
                 c.replicas, (long long)c.micro_batch,
                 group != nullptr ? (std::string(", one per process (") + f.group.backend + ")").c_str() : "",
                 data.dir.c_str(), (long long)data.train.size, (long long)data.test.size);
    if (f.restart > 0) {
      std::fprintf(stderr, "lockstep train: restart %lld of the job%s\n", (long long)f.restart,
                   f.inject.empty() ? "" : " (--inject faults fire in its first run only)");
    }
    if (f.auto_resumed && c.start_step == steps) {  // Note [A job that had ended] (replica.cpp)
      std::fprintf(stderr,
                   "lockstep train: --auto-resume: %s holds the job's last step (%lld); no step is left, so this run "
                   "evaluates its weights and writes the outputs\n",
                   f.checkpoint_file.c_str(), (long long)c.start_step);
    } else if (f.auto_resumed) {
      std::fprintf(stderr, "lockstep train: --auto-resume: going on from %s after step %lld\n",
                   f.checkpoint_file.c_str(), (long long)c.start_step);
    }
  }
  ProgressPrinter printer(f.quiet);
  const auto warn = [rank0](const std::string& message) {
    if (rank0) std::fprintf(stderr, "lockstep: warning: %s\n", message.c_str());  // one call: whole lines
  };
  // Classes are 0 .. largest label: a stray label makes classes nothing teaches.
  std::vector<char> taught(static_cast<std::size_t>(data.train.num_classes), 0);
  for (const auto label : data.train.labels) taught[static_cast<std::size_t>(label)] = 1;
  if (const auto untaught = std::count(taught.begin(), taught.end(), 0); untaught > 0) {
    warn(std::to_string(untaught) + " of the " + std::to_string(taught.size()) +
         " classes (0 to the largest label) have no training example; check the label files in " +
         data.dir.string() + ".");
  }
  if (c.check_every == 0 && std::any_of(c.inject.begin(), c.inject.end(), [](const train::Fault& x) {
        return x.kind == train::Fault::Kind::BitFlip || x.kind == train::Fault::Kind::BufferBitFlip;
      })) {
    warn("--check-every 0 turns the divergence detector off: the injected bit flip will go unnoticed and the "
         "replicas end with different weights (what the detector is there to catch).");
  }
  // A fault at a step the resumed run does not run never happens: say so,
  // rather than show a clean run as if the guards had seen nothing (not
  // refused: --auto-resume runs one command again, and the fault was in the
  // run before).
  for (const auto& x : c.inject) {
    if (x.kind != train::Fault::Kind::SameSeed && x.step < c.start_step) {
      warn("--inject names step " + std::to_string(x.step) + ", before the steps this run goes on with (from " +
           std::to_string(c.start_step) + ", " + resume_flag(f) + "): that fault will not happen in this run.");
    }
  }
  const StopOnSignal interrupt(/*announce=*/rank0 && !f.quiet);
  train::TrainHooks hooks{.on_progress = std::ref(printer),
                          .stop_requested = [&interrupt] { return interrupt.requested(); },
                          .on_warning = warn};
  // Note [Checkpoints in the background] (src/train/checkpoint.cpp). Its
  // destructor waits for the write under way, whatever ends the run.
  std::unique_ptr<train::CheckpointWriter> checkpoints;
  if (!f.checkpoint_file.empty()) {
    checkpoints = std::make_unique<train::CheckpointWriter>(
        f.checkpoint_file, train::trajectory_fields(c, data, comm::to_string(backend_of(f.group))),
        train::make_model(c, data.train.features, data.train.num_classes)->describe());
    hooks.on_checkpoint = [&checkpoints](const train::Checkpoint& cp) { checkpoints->write(cp); };
  }
  const auto save_weights = [&f](const train::TrainResult& r) {
    nn::save_weights(f.save_file, r.layout, r.params, r.buffer_layout, r.buffers,
                     {{"format", "pt"}, {"model", r.model_description}});
  };
  if (rank0 && !f.save_file.empty()) {  // Note [Lost after the last step] (trainer.cpp)
    hooks.on_lost_after_training = [&](const train::TrainResult& r) {
      save_weights(r);
      warn("a rank was lost after the last step, while the outputs were gathered; the weights it trained to the "
           "end (compared across the ranks after the last step) are saved to " + f.save_file +
           ", and the report, trace and profile are not written.");
    };
  }
  auto result =
      group != nullptr ? train::train_replica(c, data, *group, hooks) : train::train(c, data, hooks);
  if (checkpoints) checkpoints->finish();  // the last checkpoint is on disk before the run reports
  // Stopped by a signal: the outputs are written, and the exit status says
  // the run did not finish (128 + the signal, as the shell would show).
  const int exit_code = result.stopped_early && interrupt.signal() != 0 ? 128 + interrupt.signal() : 0;
  if (!rank0) return exit_code;
  if (group != nullptr) {
    // Measured now that training is over: at start-up the other ranks would
    // wait for it inside a collective. Peak of the whole job: this host's
    // times the number of hosts (train::local_world_size() ranks per host).
    c.peak_flops = host_peak() * group->size() / train::local_world_size(group->size());
    result.mfu = result.samples_per_s * result.flops_per_sample / c.peak_flops;
  } else if (result.mfu > 1 && !c.peak_flops_given) {
    // Training outran the peak measured at start-up: this machine's speed
    // varies (up to 2x over a day on a shared VM). Measure again and keep
    // the faster; if training still outran it, say so.
    c.peak_flops = std::max(c.peak_flops, measure_peak_sgemm_flops(host));
    result.mfu = result.samples_per_s * result.flops_per_sample / c.peak_flops;
  }
  if (result.mfu > 1) {
    char gflops[32];
    std::snprintf(gflops, sizeof gflops, c.peak_flops >= 1e8 ? "%.1f" : "%.3g", c.peak_flops / 1e9);
    if (c.peak_flops_given) {
      warn(std::string("MFU over 1: training ran faster than the peak --peak-gflops gives (") + gflops +
           " GFLOP/s for the job" + (group != nullptr ? ": the flag's figure per host times the hosts" : "") +
           "); check the figure, or leave the flag out to measure the peak.");
    } else if (group != nullptr) {  // the peak is one host's times the hosts, counted from LOCAL_WORLD_SIZE
      warn(std::string("MFU over 1: training ran faster than the peak taken as the job's (") + gflops +
           " GFLOP/s: this host's sgemm peak times world size / LOCAL_WORLD_SIZE); set LOCAL_WORLD_SIZE to the "
           "ranks per host, or take MFU as approximate.");
    } else {
      warn(std::string("MFU over 1: training ran faster than the sgemm peak this run measured (") + gflops +
           " GFLOP/s, the best of its measurements); the machine's speed varied during the run, so take MFU as "
           "approximate.");
    }
  }

  (takes_standard_output(output_files(f)) ? std::cerr : std::cout) << train::summary_text(c, result);
  if (!f.save_file.empty()) save_weights(result);
  // Note [A job that had ended]: a report already there is the one of the
  // run that trained (a job run again after it ended, or one that failed
  // after writing it); a run of no step would replace its timings with none.
  const bool ran_no_step = result.steps == c.start_step;
  std::error_code no_report;
  if (!f.report_file.empty() && ran_no_step && std::filesystem::is_regular_file(f.report_file, no_report)) {
    warn("--report not written: " + f.report_file + " is there already, from the run that trained, and this run "
         "ran no step; it is kept.");
  } else if (!f.report_file.empty()) {
    write_file_atomically(f.report_file, train::report_json(c, result), "the report");
  }
  // Note [A job that had ended]: the outputs that draw or time steps have
  // none from this run; an earlier run of the job ran them all.
  if (ran_no_step) {
    for (const auto& [flag, file] : {std::pair<const char*, const std::string*>{"--trace", &f.trace_file},
                                     {"--timeline-svg", &f.svg_file},
                                     {"--profile", &f.profile_file}}) {
      if (!file->empty()) {
        warn(std::string(flag) + " not written: this run went on from " + f.checkpoint_file +
             " (--auto-resume), which holds the job's last step, so it ran no step to draw or time.");
      }
    }
    return exit_code;
  }
  if (!f.trace_file.empty()) {
    train::write_chrome_trace(f.trace_file, result.timeline, c.replicas);
    if (!f.quiet)
      std::fprintf(stderr, "trace: %s (open it in https://ui.perfetto.dev)\n", f.trace_file.c_str());
  }
  if (!f.profile_file.empty() && result.steps < 2) {  // stopped early: --profile's check saw the planned steps
    warn("--profile not written: the run stopped after " + std::to_string(result.steps) +
         " step, and a profile times every step but the first.");
  } else if (!f.profile_file.empty()) {
    write_file_atomically(f.profile_file, cost::profile_to_json(measured_profile(c, result, data)), "the profile");
    if (!f.quiet) std::fprintf(stderr, "profile for lockstep plan --profile: %s\n", f.profile_file.c_str());
  }
  if (!f.svg_file.empty()) {
    // Default: the last step, when everything has warmed up.
    const std::int64_t step = f.svg_step >= 0 ? f.svg_step : result.steps - 1;
    if (step < c.start_step) {  // only with --auto-resume: check_timeline_step
      warn("--timeline-svg not written: --timeline-step " + std::to_string(step) + " ran before step " +
           std::to_string(c.start_step) + ", where this run went on from " + f.checkpoint_file +
           " (--auto-resume), in an earlier run of the job.");
      return exit_code;
    }
    if (step >= result.steps && result.stopped_early) {
      warn("--timeline-svg not written: the run stopped after step " + std::to_string(result.steps) +
           ", before the step --timeline-step asked for (" + std::to_string(step) + ").");
      return exit_code;
    }
    if (step >= result.steps) {
      throw InvalidArgument("--timeline-step " + std::to_string(step) + " is past the run's last step (" +
                            std::to_string(result.steps - 1) + ").");
    }
    write_file_atomically(f.svg_file, train::render_timeline_svg(result.timeline, c.replicas, step),
                     "the timeline");
    if (!f.quiet) std::fprintf(stderr, "timeline of step %lld: %s\n", (long long)step, f.svg_file.c_str());
  }
  return exit_code;
}

}  // namespace

std::vector<std::int64_t> parse_hidden(const std::string& text) {
  std::vector<std::int64_t> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0 || v > (1 << 20)) {
      throw InvalidArgument(
          "--hidden must be a comma-separated list of positive widths up to 1048576, such as 512,512; got '" +
          text + "'");
    }
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

Action add_train_command(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  auto& c = flags->config;
  CLI::App* cmd = app.add_subcommand("train",
                                     "Train a model with N replicas in lockstep (defaults: Fashion-MNIST, 8 "
                                     "x 32, MLP 784-512-512-10, 10 epochs)");
  cmd->option_defaults()->always_capture_default();
  flags->cmd = cmd;
  flags->replicas_option =
      cmd->add_option("--replicas", c.replicas,
                      "Number of replicas, each with a full copy of the model: threads of this process, or "
                      "with --backend gloo|mpi the world size (the default there)")
          ->transform(whole_number_in(1, 1024));
  cmd->add_option("--micro-batch", c.micro_batch,
                  "Samples per replica per step; global batch = replicas x micro-batch")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{1} << 24));
  flags->epochs_option = cmd->add_option("--epochs", c.epochs, "Epochs to train")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{100000}));
  flags->steps_option = cmd->add_option("--steps", c.steps, "Stop after this many steps instead (0: use --epochs)")
      ->transform(whole_number_in(0, std::int64_t{1} << 40));
  cmd->add_option("--model", c.model,
                  "Model: mlp (--hidden), or cnn (2 conv + batch norm + dropout, 28x28 images)")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  flags->hidden_option = cmd->add_option("--hidden", flags->hidden, "Hidden layer widths of the MLP");
  cmd->add_option("--optimizer", c.optimizer, "Optimizer")->check(CLI::IsMember({"sgd", "adamw"}));
  flags->lr_option =
      cmd->add_option("--lr", c.lr, "Peak learning rate (default 0.1 for sgd, 0.001 for adamw)")
          ->check(positive_number(1e6));
  cmd->add_option("--schedule", flags->schedule, "Learning-rate schedule")
      ->check(CLI::IsMember({"cosine", "constant"}));
  cmd->add_option("--lr-warmup", c.lr_warmup,
                  "Steps of linear warmup, lr x (step + 1) / W, before --schedule runs over the rest (0: none)")
      ->transform(whole_number_in(0, std::int64_t{1} << 40));
  cmd->add_option("--clip-grad-norm", c.clip_grad_norm,
                  "Scale the averaged gradient down to this L2 norm (over every parameter) when it is larger, as "
                  "torch.nn.utils.clip_grad_norm_; every replica computes the same norm (0: off)")
      ->check(off_or_float_number(1e30));
  cmd->add_option("--peak-gflops", flags->peak_gflops,
                  "MFU against this sgemm peak of one host, in GFLOP/s (a device's rated figure, or one figure for "
                  "runs you compare), instead of one measured on all cores (at start-up; over processes, by rank 0 "
                  "at the end) (0: measure it)")
      ->check(off_or_float_number(1e9));
  flags->momentum_option = cmd->add_option("--momentum", c.momentum, "SGD momentum")
          // float32: 1e-50 would be 0 with no word
          ->check(float_number_upto(1.0));
  flags->weight_decay_option =
      cmd->add_option("--weight-decay", c.weight_decay,
                      "Weight decay: L2 for sgd, decoupled for adamw (default 0 for sgd, 0.01 for adamw, as in PyTorch)")
          ->check(float_number_upto(1e6));
  cmd->add_flag("--nesterov", c.nesterov, "Nesterov momentum (sgd)");
  cmd->add_option("--seed", c.seed, "Seed of the initial weights and of the data order")
      ->transform(unsigned_number_upto(std::numeric_limits<std::uint64_t>::max()));
  cmd->add_option("--shuffle", flags->shuffle, "Shuffle each epoch (off: file order)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--ragged", flags->ragged,
                  "An epoch's last partial global batch: keep it as ragged shards weighted by sample count, "
                  "drop it, or pad the shards to equal size and mask the padding")
      ->check(CLI::IsMember({"weighted", "drop", "pad"}));
  cmd->add_option("--bn-stats", flags->bn_stats,
                  "Batch norm running statistics: local (each replica its own, never averaged) or sync "
                  "(the replicas' updates averaged every step, each weighted by its samples, so all hold the same)")
      ->check(CLI::IsMember({"local", "sync"}));
  cmd->add_flag("--deterministic", c.deterministic,
                "Bit-exact for any power-of-two replica count: per-atom gradients summed in one tree over atom "
                "index, divided once; drops an epoch's last partial global batch");
  cmd->add_option("--atom", c.atom, "Samples per atom in --deterministic mode")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_option(
         "--accumulate", c.accumulate,
         "Micro-steps per optimizer step, accumulated locally with one all-reduce at the end; effective "
         "batch = replicas x micro-batch x accumulate")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{65536}));
  cmd->add_option("--bucket-mb", c.bucket_mb,
                  "Gradient bucket size in MiB (0: one bucket after backward, no overlap; with --overlap auto, "
                  "unless given or with a link, also 0 where a host, or a process, runs as many replicas as it has cores)")
      ->check(number_in(0.0, 1e6));
  cmd->add_option("--first-bucket-mb", c.first_bucket_mb,
                  "Size in MiB of the first bucket (the last layers' gradients, ready first)")
      ->check(number_in(0.0, 1e6));
  cmd->add_option("--overlap", flags->overlap,
                  "All-reduce each bucket on a communication thread during backward (on), after backward "
                  "(off), or on only when the transport is not the cores themselves (auto: with a link; and one "
                  "bucket where the replicas share the cores)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--compress", flags->compress,
                  "All-reduce gradients in bf16 (half the bytes, error feedback)")
      ->check(CLI::IsMember({"none", "bf16"}));
  cmd->add_option("--zero", flags->config.zero,
                  "ZeRO stage: 0, every replica holds the whole optimizer state; 1, each holds its own 1/N "
                  "shard (gradients reduce-scattered, weights all-gathered: the same bytes as one all-reduce)")
      ->default_val(0)
      // Read in base 10 like every whole number (CLI11's own conversion said
      // "Could not convert: --zero = 1.5", read 010 as 8 and '' as 0); stages 2
      // and 3 reach the trainer, whose message says lockstep plan prices them.
      ->transform(whole_number_in(0, 3));
  cmd->add_option("--link-bandwidth", flags->link_bandwidth,
                  "Model a link of this bandwidth between replicas, e.g. 10Gbit or 10GB/s (default: none)");
  cmd->add_option("--link-latency", flags->link_latency,
                  "Model this latency per message between replicas, e.g. 50us (default: none)");
  cmd->add_option(
      "--trace", flags->trace_file,
      "Write a Chrome trace (JSON) of every replica's forward, backward, all-reduce and optimizer "
      "spans; open it in Perfetto");
  cmd->add_option("--timeline-svg", flags->svg_file,
                  "Draw one step's timeline (replicas x compute/communication) as an SVG file");
  cmd->add_option(
      "--profile", flags->profile_file,
      "Write per-layer parameter bytes and forward/backward times (JSON) for lockstep plan --profile");
  cmd->add_option("--timeline-step", flags->svg_step, "The step --timeline-svg draws (default: the last)")
      ->transform(whole_number_in(0, std::int64_t{1} << 40))
      ->default_str("");  // -1 stands for "the last"
  cmd->add_option("--data", flags->data_dir,
                  "Directory of an IDX data set (train-images-idx3-ubyte[.gz], ...)");
  cmd->add_flag("--normalize", flags->normalize, "Standardise inputs with the training set's mean and std");
  cmd->add_option("--init", flags->init_file,
                  "Start from these weights (safetensors, or a --checkpoint's) instead of a fresh init");
  cmd->add_option("--save", flags->save_file, "Write the final weights and batch-norm statistics here (safetensors, PyTorch state_dict names)");
  cmd->add_option("--checkpoint", flags->checkpoint_file,
                  "Write a checkpoint here (weights, optimizer state, progress) at each epoch's end, every "
                  "--checkpoint-every steps, at the end and when interrupted, for --resume");
  cmd->add_option("--checkpoint-every", c.checkpoint_every, "Steps between checkpoints (0: at epoch ends only)")
      ->transform(whole_number_in(0, std::int64_t{1} << 40));
  cmd->add_option("--resume", flags->resume_file,
                  "Go on from this checkpoint, to end as the unbroken run would; the flags that shape the weights "
                  "must be the checkpoint run's");
  cmd->add_flag("--auto-resume", flags->auto_resume,
                "Go on from --checkpoint's file when it is there, else start afresh: the one command for a job that "
                "lockstep launch --max-restarts (or a scheduler) starts again");
  cmd->add_option("--report", flags->report_file, "Write the run summary here as JSON (docs/report.md)");
  cmd->add_option("--algorithm", flags->algorithm, "All-reduce algorithm")
      ->check(CLI::IsMember({"auto", "ring", "halving_doubling", "naive", "shared_memory", "native", "tree", "hierarchical"}));
  cmd->add_option("--timeout", flags->timeout_s, "Seconds any collective may wait before the run is aborted")
      ->check(number_in(0.001, 1e6));
  cmd->add_option(
         "--check-every", c.check_every,
         "Compare fingerprints of every replica's weights and optimizer state every K steps (0: never)")
      ->transform(whole_number_in(std::int64_t{0}, std::int64_t{1} << 30));
  cmd->add_option("--on-divergence", flags->on_divergence,
                  "When replicas differ: stop with an error naming the step, tensor and ranks, or repair "
                  "(re-broadcast from a majority replica and warn)")
      ->check(CLI::IsMember({"stop", "repair"}));
  cmd->add_option("--max-skips", c.max_skips,
                  "Stop after this many consecutive steps skipped for non-finite gradients")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{1} << 30));
  cmd->add_option("--inject", flags->inject,
                  "Inject a fault to see the guards catch it: bitflip@STEP:RANK (one weight bit after the "
                  "update), bitflip-buffer@STEP:RANK (one buffer value), nan@STEP:RANK (a local gradient), throw@STEP:RANK (STEP may be the run's steps: after the last "
                  "one), same-seed (every replica reads rank 0's shard); repeatable; in a job's first run only, not after lockstep launch --max-restarts restarts it")
      ->allow_extra_args(false);
  cmd->add_option("--log-every", c.log_every, "Progress every this many steps")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{1} << 30));
  cmd->add_flag("--quiet", flags->quiet, "No progress output");
  add_process_group_flags(*cmd, flags->group, /*with_timeout=*/false);  // --timeout is above
  return [flags] { return run_train(*flags); };
}

}  // namespace lockstep::cli
