// The trainer: N replicas in lockstep, wired from the pieces of the data path.
//
//   data (shared, read-only) -> sampler shard -> model forward/backward (local)
//     -> average_gradients (the one all-reduce) -> optimizer step (identical)
//
// Weights are initialised once on rank 0 (or loaded) and broadcast; after
// that only gradients cross between replicas, and the bytes every replica
// sent are counted by the communicator and split by purpose in the result.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/comm/collectives.h"
#include "lockstep/comm/modelled_link.h"
#include "lockstep/data/dataset.h"
#include "lockstep/ddp/reducer.h"
#include "lockstep/ddp/sampler.h"
#include "lockstep/nn/arena.h"
#include "lockstep/nn/model.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/train/timeline.h"

namespace lockstep::train {

// What to do when a step's samples do not split evenly over the replicas
// (an epoch's last, partial global batch).
enum class Ragged {
  Weighted,  // keep it; weight each replica's gradient by its sample count (exact mean)
  Drop,      // drop the partial global batch: every step has exactly N x micro-batch samples
  Pad,       // keep it; pad short shards to equal size and mask the padding out of the loss
};
const char* to_string(Ragged ragged);

// Whether the reducer's communication thread overlaps the all-reduce with
// backward. Auto: on when the communicator has no native all-reduce (a
// network transport, or the modelled link), off for the in-process
// shared-memory path, whose "communication" is memory work by the same cores
// that compute (docs/results.md measures what a second thread costs there).
enum class Overlap { Auto, On, Off };
Ragged ragged_from_string(std::string_view name);  // throws InvalidArgument naming the choices

// How batch norm's running statistics (the model's buffers) are kept.
enum class BnStats {
  Local,  // each replica updates its own from its own micro-batches; never averaged; they differ
  Sync,   // each step, the replicas' updates are averaged, weighted by their samples (one small all-reduce), so all hold the same
};
BnStats bn_stats_from_string(std::string_view name);  // throws InvalidArgument

// What the divergence detector does when the replicas' fingerprints differ.
enum class OnDivergence {
  Stop,    // every replica throws an Error naming the step, the first tensor and the odd ranks
  Repair,  // re-broadcast weights and optimizer state from a majority rank, warn, go on
};
OnDivergence on_divergence_from_string(std::string_view name);  // throws InvalidArgument

// A fault injected on purpose, to show that the guards catch it
// (`--inject KIND@STEP:RANK`; STEP is 0-based).
struct Fault {
  enum class Kind {
    BitFlip,  // after the step's optimizer update, flip one bit of one weight on RANK
    BufferBitFlip,  // the same in one buffer value (batch norm running statistics): "bitflip-buffer@S:R"
    NaN,      // make one of RANK's local gradients NaN before the all-reduce
    Throw,    // RANK throws an Error at the start of the step
    SameSeed,  // the card's bug: every replica reads rank 0's shard (as if all drew it with one seed);
               // every step, every rank ("--inject same-seed")
  };
  Kind kind = Kind::BitFlip;
  std::int64_t step = 0;
  int rank = 0;
};
// "bitflip@20:3", "nan@5:0", "throw@2:1", "same-seed"; throws InvalidArgument on anything else.
Fault fault_from_string(std::string_view spec);

// Builds a model for `features` inputs and `classes` outputs: TrainConfig::model_factory.
using ModelFactory = std::function<std::unique_ptr<nn::Model>(std::int64_t features, std::int64_t classes)>;

// Each field is the `lockstep train` flag of the same name (micro_batch is
// --micro-batch, check_every --check-every), and train()'s errors name the
// flags: a program reads "--zero 1" as `zero = 1`.
struct TrainConfig {
  int replicas = 8;
  std::int64_t micro_batch = 32;
  std::int64_t epochs = 10;
  std::int64_t steps = 0;  // > 0: stop after this many steps instead of `epochs`
  // The model. Without model_factory, a built-in one: "mlp" (the widths of
  // `hidden`) or "cnn" (nn::make_cnn: 28x28 single-channel images). With it,
  // the name of the model it builds: not empty, not "mlp" or "cnn" (else
  // InvalidArgument). The name is a start-up handshake field and a
  // trajectory field, so a checkpoint of a model of another name is refused
  // on resume, as is one of another layout (layers, tensor names and shapes).
  std::string model = "mlp";
  std::vector<std::int64_t> hidden = {512, 512};  // --model mlp only; ignored otherwise
  // A model of the user's own, from the public layers (nn/layer.h), trained
  // with every guarantee a built-in one has. Empty (the default): built-in.
  // Contract, checked where it can be (InvalidArgument names what broke it):
  // - called with the training set's features and classes wherever the
  //   library builds the model: once to plan each train(), train_replica(),
  //   total_steps() and trajectory_fields() call, once for each replica of
  //   the run in this process, and by load_checkpoint(), load_checkpoint_weights()
  //   and resume_from();
  // - returns a model (never null) of `features` inputs, `classes` outputs
  //   and at least one parameter;
  // - builds the same model every call: the same layers (Model::describe()),
  //   parameters and buffers (names, shapes, order). Every model a run builds
  //   in a process is compared with its first; the handshake compares the
  //   processes'. Its weights need not be set: rank 0 initialises its model
  //   (Model::init(seed), or the initial_* state) and broadcasts them;
  // - need not be thread-safe: train() calls it from the replicas' threads,
  //   but one call at a time. Only a factory shared by train() calls that run
  //   at once is called concurrently. The config's copies share what it
  //   captures by reference or pointer.
  ModelFactory model_factory;
  std::string optimizer = "sgd";  // sgd | adamw
  float lr = 0.1f;
  optim::Schedule schedule = optim::Schedule::Cosine;
  std::int64_t lr_warmup = 0;  // optimizer steps of linear warmup before the schedule (optim::learning_rate)
  // > 0: scale the averaged gradient down to this L2 norm (over every
  // parameter) whenever it is larger, as torch.nn.utils.clip_grad_norm_;
  // every replica computes the same norm (docs/design.md, "Clipping").
  float clip_grad_norm = 0;
  float momentum = 0.9f;
  float weight_decay = 0.0f;  // lockstep train: 0.01 with --optimizer adamw unless given (and lr 0.001)
  bool nesterov = false;
  std::uint64_t seed = 0;
  bool shuffle = true;
  Ragged ragged = Ragged::Weighted;
  std::int64_t accumulate = 1;  // micro-steps per optimizer step, one all-reduce at the last
  comm::Algorithm algorithm = comm::Algorithm::Auto;
  double first_bucket_mb = 1;  // gradient buckets (ddp/reducer.h); bucket_mb 0 = one bucket
  double bucket_mb = 25;
  // Set by lockstep train, which then sets bucket_mb 0: the replicas share
  // their host's cores, so nothing would overlap (docs/design.md, "One
  // step"). Only what the summary and report say.
  bool one_bucket_on_shared_cores = false;
  // Set by lockstep train when a --resume run took the checkpoint's bucket
  // layout, no bucket flag having been given. Only what the summary says.
  bool buckets_from_checkpoint = false;
  ddp::Compression compression = ddp::Compression::None;
  Overlap overlap = Overlap::Auto;
  comm::LinkModel link;  // modelled interconnect between the replicas; default: none
  // ZeRO stage: 0, every replica holds the whole optimizer state; 1, each
  // holds only its own shard of it (docs/design.md, "Sharded optimizer
  // state"): gradients are reduce-scattered, each replica updates its shard
  // of the weights, and the weights are all-gathered every step.
  int zero = 0;
  // Bit-exact for any power-of-two replica count (src/train/atoms.h): gradients of `atom`-sample atoms,
  // summed in one tree over atom index; the last partial global batch of an epoch is dropped.
  bool deterministic = false;
  std::int64_t atom = 32;
  BnStats bn_stats = BnStats::Local;  // deterministic mode always sums the buffers' updates in its tree
  comm::Duration timeout{std::chrono::seconds(60)};
  int ranks_per_node = 0;  // in-process replicas per modelled node (0: one node), for the hierarchical all-reduce
  // Test accuracy after every epoch (and after the run's last step). false:
  // the test set is not read, and may be empty (a default data::Dataset).
  bool evaluate = true;
  std::int64_t log_every = 50;                       // progress every this many steps
  // How often the replicas agree on TrainHooks::stop_requested, in wall time:
  // after the first step, then every max(1, this / the mean step time since
  // the last vote) steps, and at every progress point (so at most every
  // log_every steps).
  double stop_poll_ms = 1000;
  // Replace init (e.g. --init FILE): the weights, and batch norm's running
  // statistics. A NaN or an infinity in either is refused (InvalidArgument).
  std::optional<std::vector<float>> initial_params;
  std::optional<std::vector<float>> initial_buffers;
  // Going on from a checkpoint (--resume; TrainHooks::on_checkpoint wrote
  // it): the steps it had run (the loop starts at this step, with the data
  // order, schedule and checks of an unbroken run), its whole optimizer
  // state (every slot laid out as the parameters; under --zero 1 each
  // replica keeps its own shard of it) and the optimizer's
  // count of steps taken (skipped steps are not). initial_params and
  // initial_buffers hold its weights and buffers. start_step may be the
  // run's last: no step runs, and the weights are evaluated (Note [A job
  // that had ended]).
  std::int64_t start_step = 0;
  std::optional<std::vector<float>> initial_optimizer_state;
  std::int64_t initial_optimizer_steps = 0;
  // The steps skipped in a row just before start_step (Checkpoint::
  // skips_in_a_row): --max-skips counts on from there, as in the unbroken run.
  std::int64_t initial_skips_in_a_row = 0;
  // State that differs by replica, replica r's at [r x size, (r+1) x size):
  // --bn-stats local's buffers (replicas x buffer floats; rank 0's are also
  // initial_buffers) and --compress bf16's rounding error carried to the
  // next step (replicas x P). Needed to resume those runs; null otherwise.
  // Shared, not copied, by the replicas' copies of the config (replicas x
  // replicas x P would not fit); rank 0's is scattered, one part to each.
  std::shared_ptr<const std::vector<float>> initial_replica_buffers, initial_error_feedback;
  // TrainHooks::on_checkpoint every this many steps (0: at epoch ends only),
  // and always at each epoch's end and the run's last step.
  std::int64_t checkpoint_every = 0;
  // The cores this process may use, shared by the replicas on this host for
  // their BLAS threads (lockstep train: its cgroup's and affinity's); 0:
  // std::thread::hardware_concurrency().
  int cores = 0;
  double peak_flops = 0;                             // the peak MFU is against (FLOP/s); 0 = no MFU
  bool peak_flops_given = false;                     // stated by the user (lockstep train --peak-gflops), not measured
  std::int64_t warmup_steps = 0;                     // steps left out of the throughput timing
  bool record_timeline = false;                      // keep every event (for --trace, --timeline-svg)
  // Guards (docs/design.md, "Guards"). Replicas always run the start-up
  // handshake and verify the broadcast weights.
  // Compare weight and optimizer-state fingerprints every K steps; 0 = never. 20: the smallest K
  // whose check costs under 2% of the default run's step time (docs/results.md, "Guards").
  std::int64_t check_every = 20;
  OnDivergence on_divergence = OnDivergence::Stop;
  std::int64_t max_skips = 5;  // stop after this many consecutive steps with non-finite gradients
  std::vector<Fault> inject;   // faults to inject (tests and demonstrations)
};

// Per-step times, each the median over the steps of the run (all replicas).
struct StepTimes {
  double step_ms = 0;
  double compute_ms = 0;        // forward, backward and optimizer: the step minus its wait
  double comm_ms = 0;           // the buckets' all-reduces, on the communication thread
  double exposed_comm_ms = 0;   // waited on communication after backward ended
  double overlap_fraction = 0;  // 1 - exposed / comm
  double check_ms = 0;          // the divergence check (fingerprints + compare), on the steps that ran it
  // comm_ms split at the moment the last replica started each all-reduce:
  // before it, a replica waits for the others to join (on shared cores, for
  // the OS to run them); after it, the all-reduce itself runs. Measured on
  // one clock, so only when every replica ran in this process; NaN otherwise.
  double comm_wait_ms = std::numeric_limits<double>::quiet_NaN();
  double comm_joined_ms = std::numeric_limits<double>::quiet_NaN();
};

struct Progress {
  std::int64_t epoch = 0;  // 0-based
  std::int64_t step = 0;   // steps completed
  std::int64_t total_steps = 0;
  double loss = 0;           // mean training loss since the last report
  double samples_per_s = 0;  // since the start of training
  float lr = 0;
  StepTimes times;                      // rank 0's medians since the last report
  std::optional<double> test_accuracy;  // set at the end of an epoch
  // --clip-grad-norm: the largest norm of the averaged gradient since the
  // last report (before clipping), and at how many of those steps it was clipped.
  std::optional<double> grad_norm;
  std::int64_t clipped = 0;
};

struct TrafficBytes {  // bytes one replica sent, measured at the communicator
  std::uint64_t init_broadcast = 0;
  std::uint64_t setup = 0;        // start-up checks (handshake, weight verification, bucket layout)
  std::uint64_t gradients = 0;    // all steps together
  std::uint64_t gradient_messages = 0;  // messages those bytes took (0: the shared-memory all-reduce, none)
  std::uint64_t control = 0;      // loss and accuracy tallies
  std::uint64_t checks = 0;       // fingerprints and non-finite flags
  std::uint64_t repair = 0;       // weights re-broadcast by --on-divergence repair
  std::uint64_t buffers = 0;      // buffer updates averaged by --bn-stats sync
  std::uint64_t weights = 0;      // weights all-gathered after each sharded optimizer step (--zero 1)
  std::uint64_t resume = 0;       // the state rank 0 sent from a checkpoint (--resume): broadcast, or scattered
  std::uint64_t checkpoint = 0;   // per-replica state gathered to rank 0 for a checkpoint (--zero 1, local bn, bf16)
  std::uint64_t clip = 0;         // each replica's share of the gradient norm (--clip-grad-norm with --zero 1)
  std::uint64_t unaccounted = 0;  // anything else (must be 0)
};

struct TrainResult {
  // steps: the steps run (the config's, unless stopped early).
  std::int64_t replicas = 0, micro_batch = 0, accumulate = 1, global_batch = 0, steps = 0;
  std::int64_t steps_planned = 0;  // the config's steps (--steps, or --epochs' steps)
  bool stopped_early = false;      // TrainHooks::stop_requested ended the run before its last step
  std::int64_t resumed_from_step = 0;  // config.start_step: steps counts from 0 all the same
  std::int64_t epochs_run = 0;  // epochs completed
  double epochs = 0;            // steps / steps per epoch: fractional when the run ends mid-epoch
  std::int64_t samples_seen = 0;
  // An epoch's last step when it is partial: its samples and the smallest
  // and largest shard (the sampler cuts them as evenly as it can); 0 when
  // every step is full, --ragged drop drops the rest, or the run ends before it.
  std::int64_t last_step_samples = 0, last_step_min_shard = 0, last_step_max_shard = 0;
  // The samples an epoch leaves out: its last, partial batch, which
  // --ragged drop and --deterministic never form; 0 when every step is full,
  // the batch is kept, or the run ends before an epoch's last step.
  std::int64_t samples_dropped_per_epoch = 0;
  double final_loss = 0;
  // The steps final_loss is the mean over, 1-based: the last progress
  // window (a resumed run's begins no earlier than its first step). Both 0
  // when the run ran no step (its final_loss is NaN).
  std::int64_t final_loss_first_step = 0, final_loss_last_step = 0;
  // A resumed run's window that began at its first step where the unbroken
  // run's began earlier (resumed between progress points): final_loss is
  // then over fewer steps than the unbroken run's.
  bool final_loss_window_cut = false;
  std::optional<double> test_accuracy;
  std::vector<double> epoch_test_accuracy;
  double train_seconds = 0;  // step loop only, without evaluation
  double samples_per_s = 0;
  double flops_per_sample = 0;
  double mfu = 0;  // 0 if no peak was given
  std::uint64_t param_count = 0;
  std::uint64_t weight_bytes = 0, grad_bytes = 0;
  // The largest replica's optimizer state; under --zero 1 its shard of the
  // whole, which is what every replica holds without it.
  std::uint64_t optimizer_state_bytes = 0, optimizer_state_bytes_whole = 0;
  int zero = 0;  // the ZeRO stage trained (0 when --zero 1 had one replica: nothing to shard)
  std::uint64_t allreduce_bytes_per_step_formula = 0;  // 2P(N-1)/N
  std::vector<TrafficBytes> traffic;                   // per replica
  StepTimes times;
  std::vector<ddp::Bucket> buckets;     // launch order
  bool overlapped = false;              // whether the reducer ran a communication thread
  std::vector<TimelineEvent> timeline;  // every replica's, if config.record_timeline
  std::string model_description, optimizer_description;
  nn::Layout layout;
  nn::Layout buffer_layout;   // e.g. batch norm running statistics; kept per replica
  std::vector<float> params;   // replica 0's final weights
  std::vector<float> buffers;  // replica 0's final buffers (buffer_layout)
  std::size_t handshake_fields = 0;
  std::int64_t divergence_checks = 0, repairs = 0;
  std::int64_t accounting_checks = 0;  // exactly-once data accounting (every check step and epoch end)
  // --bn-stats local: at how many divergence checks the buffers differed
  // between replicas (expected, not divergence).
  std::int64_t buffer_checks_differing = 0;
  struct Skip {
    std::int64_t step = 0;
    std::vector<int> ranks;  // the replicas whose local gradient was not finite
  };
  std::vector<Skip> skipped;  // steps every replica skipped
  // --clip-grad-norm: the norm of each step's averaged gradient before
  // clipping (skipped steps have none), and how many steps were clipped.
  std::vector<double> grad_norms;
  std::int64_t clipped_steps = 0;
};

// What a run needs to go on from where it is (TrainHooks::on_checkpoint):
// rank 0's weights, buffers and optimizer state, all replicated, so they are
// every replica's. TrainConfig::start_step and initial_* take them back.
struct Checkpoint {
  std::int64_t steps_done = 0;     // steps completed: the step a resumed run starts at
  std::int64_t steps_planned = 0;  // the run's total (its schedule depends on it)
  std::int64_t optimizer_steps = 0;  // updates the optimizer made (skipped steps make none)
  std::int64_t skips_in_a_row = 0;   // the last steps skipped in a row (non-finite gradients), for --max-skips
  const nn::Layout* layout = nullptr;
  const nn::Layout* buffer_layout = nullptr;
  std::vector<std::string> slot_names;  // the optimizer's state slots, each laid out as `layout`
  // Rank 0's weights and buffers; the whole optimizer state (under --zero 1
  // gathered from every replica's shard), every slot laid out as `layout`.
  std::span<const float> params, buffers, optimizer_state;
  // State that differs by replica, replica r's at [r x size, (r+1) x size),
  // empty unless the run keeps it: every replica's buffers (--bn-stats
  // local) and every replica's bf16 rounding error (--compress bf16; each
  // laid out as `layout`). See TrainConfig::initial_replica_buffers.
  std::span<const float> replica_buffers, error_feedback;
};

struct TrainHooks {
  // Called on rank 0's thread every log_every steps and at each epoch end.
  std::function<void(const Progress&)> on_progress;
  // Called on every replica's thread after each optimizer step (tests).
  std::function<void(int rank, std::int64_t step, std::span<const float> params,
                     std::span<const float> optimizer_state)>
      on_replica_step;
  // Called on every replica's thread with its own copy of the config before
  // the start-up handshake (tests: make one replica differ).
  std::function<void(int rank, TrainConfig& config)> on_replica_config;
  // Polled on every replica's thread at each vote point: after the first
  // step, then about every config.stop_poll_ms of steps (Note [Paced stop
  // votes]), and at each progress point (every log_every steps and each epoch
  // end); must be thread-safe (an atomic flag, set from a signal handler). If
  // it returns true on any replica, every replica stops after that step, as
  // if it were the run's last: the weights are compared and the test set
  // evaluated, and TrainResult::stopped_early is set. At a progress point the
  // vote rides on the progress tallies' all-reduce; elsewhere (and under
  // --deterministic) it is a two-float all-reduce.
  std::function<bool()> stop_requested;
  // Called on rank 0's thread (rank 0's process) after the step's checks,
  // every config.checkpoint_every steps, at each epoch's end, and after the
  // run's last step (also when stopped early); the others wait in the next
  // collective. The spans are valid during the call only. State that the
  // replicas hold differently is gathered to rank 0 first, by every replica
  // (a collective; TrafficBytes::checkpoint): --zero 1's optimizer shards,
  // --bn-stats local's buffers, --compress bf16's rounding errors.
  std::function<void(const Checkpoint&)> on_checkpoint;
  // Warnings (a skipped step, a repair, an injected fault), one sentence
  // each. Called from any replica's thread; must be thread-safe.
  std::function<void(const std::string& message)> on_warning;
  // train_replica only (processes): called on rank 0's thread when the run
  // has trained to its end (its weights compared, the test set evaluated) but
  // gathering the ranks' traffic and timelines then failed (a rank lost or
  // hung after the last step; Note [Lost after the last step]). `result` holds
  // the final weights and buffers, and rank 0's own traffic only; train_replica
  // throws the failure after the call, so a program can keep the weights
  // (lockstep train writes --save). What the hook throws is ignored.
  std::function<void(const TrainResult& result)> on_lost_after_training;
};

// Builds the model that TrainConfig describes (every replica calls this): the
// built-in `config.model`, or config.model_factory's. Throws InvalidArgument
// if the factory returns null, or a model of other inputs or outputs than
// `features` and `classes`, or one without parameters.
std::unique_ptr<nn::Model> make_model(const TrainConfig& config, std::int64_t features, std::int64_t classes);

// Builds the optimizer that TrainConfig describes for `numel` parameters.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& config, std::size_t numel);

// The steps train() would run for this config and data: --steps, or the
// epochs times the sampler's steps per epoch under the config's last-batch
// policy. Throws InvalidArgument as train() does, for the same reasons.
std::int64_t total_steps(const TrainConfig& config, const data::ImageClassificationData& data);

// The settings that shape a run's weights, named by their flags ("--lr",
// "0.1"), the model, the data and the replica count included: a checkpoint
// records them, and a run that goes on from it must have the same.
// `transport`: "threads" (train()) or the process group's backend ("gloo",
// "mpi"), which with --algorithm auto decides which all-reduce runs (with a
// modelled link too), and so the last bits of the sums. Throws
// InvalidArgument as train() does.
std::vector<std::pair<std::string, std::string>> trajectory_fields(const TrainConfig& config,
                                                                   const data::ImageClassificationData& data,
                                                                   const std::string& transport = "threads");

// Runs training. Throws InvalidArgument for a config that cannot work, and
// rethrows the first replica's error if one fails (the others are stopped).
TrainResult train(const TrainConfig& config, const data::ImageClassificationData& data,
                  const TrainHooks& hooks = {});

// Runs this process's one replica of a group that spans processes (Gloo,
// MPI: comm/process_group.h). `config.replicas` must equal comm.size(). The
// result is the same as train()'s, seen from this rank: `params` and the
// step-time medians are this rank's own; `traffic` holds every rank's
// (gathered at the end); with config.record_timeline, rank 0's `timeline`
// holds every rank's events, moved onto rank 0's clock (the others hold
// their own). OpenBLAS threads: the cores are shared
// by local_world_size() processes. A failure on this
// rank aborts the group with its reason, so the other ranks stop at once.
TrainResult train_replica(const TrainConfig& config, const data::ImageClassificationData& data,
                          comm::Communicator& comm, const TrainHooks& hooks = {});

// The ranks of a process group that share this host's cores: LOCAL_WORLD_SIZE
// (torchrun, `lockstep launch`), else OMPI_COMM_WORLD_LOCAL_SIZE (mpirun),
// else the whole world. Throws InvalidArgument for a value outside [1, world].
int local_world_size(int world_size);

}  // namespace lockstep::train
