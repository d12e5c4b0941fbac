// `lockstep train`: flags -> TrainConfig -> train() -> summary, report, weights.
// With --backend gloo|mpi this process is one rank of a group of processes
// (train_replica()); rank 0 alone prints and writes files.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <span>
#include <string>

#include "checks.h"
#include "commands.h"
#include "host_memory.h"
#include "lockstep/error.h"
#include "lockstep/nn/weights_file.h"
#include "lockstep/train/checkpoint.h"
#include "process_group_flags.h"
#include "restarts.h"
#include "train_and_report.h"
#include "train_as_rank.h"
#include "train_flag_checks.h"
#include "train_flags.h"

namespace lockstep::cli {
namespace {

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
  if (c.link.enabled() &&
      backend_of(f.group) != comm::Backend::Threads) {  // before the rendezvous, not after
    throw InvalidArgument("a modelled link (--link-bandwidth/--link-latency) is for the threads backend; a " +
                          f.group.backend + " process group has real links. Leave them out.");
  }
  c.record_timeline = !f.trace_file.empty() || !f.svg_file.empty() || !f.profile_file.empty();
  if (f.lr_option->count() == 0 && c.optimizer == "adamw") c.lr = 1e-3f;
  if (f.weight_decay_option->count() == 0 && c.optimizer == "adamw")
    c.weight_decay = 0.01f;  // torch.optim.AdamW's
  c.on_divergence = train::on_divergence_from_string(f.on_divergence);
  for (const auto& spec : f.inject) c.inject.push_back(train::fault_from_string(spec));
  c.timeout = comm::Duration(static_cast<std::int64_t>(std::ceil(f.timeout_s * 1000)));
  const bool in_group = backend_of(f.group) != comm::Backend::Threads;
  check_flag_combinations(f);
  check_nodes(f.group, c.replicas, c.algorithm, c.link.enabled());
  if (c.zero == 1 && f.group.per_node > 0)
    throw InvalidArgument(
        "--per-node groups replicas for the hierarchical all-reduce, and --zero 1 reduce-scatters "
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
        if (train::is_checkpoint(
                f.init_file)) {  // its weights and buffers; the optimizer state is --resume's
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
      if (const nn::TensorSpec* t = nn::first_nonfinite_tensor(layout, all)) {
        throw InvalidArgument("--init " + f.init_file + ": tensor " + t->name +
                              " holds NaN or infinite values; no model trains from them. Give weights saved "
                              "from a healthy run.");
      }
    };
    check_finite(model->layout(), state.params);
    if (state.buffers) check_finite(model->buffer_layout(), *state.buffers);
    if (!state.buffers && model->buffer_layout().numel() > 0 && !f.quiet) {
      std::fprintf(
          stderr,
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
  flags->steps_option =
      cmd->add_option("--steps", c.steps, "Stop after this many steps instead (0: use --epochs)")
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
  cmd->add_option(
         "--lr-warmup", c.lr_warmup,
         "Steps of linear warmup, lr x (step + 1) / W, before --schedule runs over the rest (0: none)")
      ->transform(whole_number_in(0, std::int64_t{1} << 40));
  cmd->add_option(
         "--clip-grad-norm", c.clip_grad_norm,
         "Scale the averaged gradient down to this L2 norm (over every parameter) when it is larger, as "
         "torch.nn.utils.clip_grad_norm_; every replica computes the same norm (0: off)")
      ->check(off_or_float_number(1e30));
  cmd->add_option(
         "--peak-gflops", flags->peak_gflops,
         "MFU against this sgemm peak of one host, in GFLOP/s (a device's rated figure, or one figure for "
         "runs you compare), instead of one measured on all cores (at start-up; over processes, by rank 0 "
         "at the end) (0: measure it)")
      ->check(off_or_float_number(1e9));
  flags->momentum_option = cmd->add_option("--momentum", c.momentum, "SGD momentum")
                               // float32: 1e-50 would be 0 with no word
                               ->check(float_number_upto(1.0));
  flags->weight_decay_option = cmd->add_option("--weight-decay", c.weight_decay,
                                               "Weight decay: L2 for sgd, decoupled for adamw (default 0 for "
                                               "sgd, 0.01 for adamw, as in PyTorch)")
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
  cmd->add_option(
         "--bn-stats", flags->bn_stats,
         "Batch norm running statistics: local (each replica its own, never averaged) or sync "
         "(the replicas' updates averaged every step, each weighted by its samples, so all hold the same)")
      ->check(CLI::IsMember({"local", "sync"}));
  cmd->add_flag(
      "--deterministic", c.deterministic,
      "Bit-exact for any power-of-two replica count: per-atom gradients summed in one tree over atom "
      "index, divided once; drops an epoch's last partial global batch");
  cmd->add_option("--atom", c.atom, "Samples per atom in --deterministic mode")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_option(
         "--accumulate", c.accumulate,
         "Micro-steps per optimizer step, accumulated locally with one all-reduce at the end; effective "
         "batch = replicas x micro-batch x accumulate")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{65536}));
  cmd->add_option(
         "--bucket-mb", c.bucket_mb,
         "Gradient bucket size in MiB (0: one bucket after backward, no overlap; with --overlap auto, "
         "unless given or with a link, also 0 where a host, or a process, runs as many replicas as it has "
         "cores)")
      ->check(number_in(0.0, 1e6));
  cmd->add_option("--first-bucket-mb", c.first_bucket_mb,
                  "Size in MiB of the first bucket (the last layers' gradients, ready first)")
      ->check(number_in(0.0, 1e6));
  cmd->add_option(
         "--overlap", flags->overlap,
         "All-reduce each bucket on a communication thread during backward (on), after backward "
         "(off), or on only when the transport is not the cores themselves (auto: with a link; and one "
         "bucket where the replicas share the cores)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--compress", flags->compress,
                  "All-reduce gradients in bf16 (half the bytes, error feedback)")
      ->check(CLI::IsMember({"none", "bf16"}));
  cmd->add_option(
         "--zero", flags->config.zero,
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
  cmd->add_option(
      "--save", flags->save_file,
      "Write the final weights and batch-norm statistics here (safetensors, PyTorch state_dict names)");
  cmd->add_option("--checkpoint", flags->checkpoint_file,
                  "Write a checkpoint here (weights, optimizer state, progress) at each epoch's end, every "
                  "--checkpoint-every steps, at the end and when interrupted, for --resume");
  cmd->add_option("--checkpoint-every", c.checkpoint_every,
                  "Steps between checkpoints (0: at epoch ends only)")
      ->transform(whole_number_in(0, std::int64_t{1} << 40));
  cmd->add_option(
      "--resume", flags->resume_file,
      "Go on from this checkpoint, to end as the unbroken run would; the flags that shape the weights "
      "must be the checkpoint run's");
  cmd->add_flag(
      "--auto-resume", flags->auto_resume,
      "Go on from --checkpoint's file when it is there, else start afresh: the one command for a job that "
      "lockstep launch --max-restarts (or a scheduler) starts again");
  cmd->add_option("--report", flags->report_file, "Write the run summary here as JSON (docs/report.md)");
  cmd->add_option("--algorithm", flags->algorithm, "All-reduce algorithm")
      ->check(CLI::IsMember(
          {"auto", "ring", "halving_doubling", "naive", "shared_memory", "native", "tree", "hierarchical"}));
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
                  "update), bitflip-buffer@STEP:RANK (one buffer value), nan@STEP:RANK (a local gradient), "
                  "throw@STEP:RANK (STEP may be the run's steps: after the last "
                  "one), same-seed (every replica reads rank 0's shard); repeatable; in a job's first run "
                  "only, not after lockstep launch --max-restarts restarts it")
      ->allow_extra_args(false);
  cmd->add_option("--log-every", c.log_every, "Progress every this many steps")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{1} << 30));
  cmd->add_flag("--quiet", flags->quiet, "No progress output");
  add_process_group_flags(*cmd, flags->group, /*with_timeout=*/false);  // --timeout is above
  return [flags] { return run_train(*flags); };
}

}  // namespace lockstep::cli
