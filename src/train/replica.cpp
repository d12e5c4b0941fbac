// One replica: the card's step, in order.
//   1. take this replica's shard of the global batch (no communication);
//   2. forward and backward through its own weights (activations stay here),
//      in `accumulate` micro-steps that add into the same gradients;
//   3. during the last backward, each layer's gradients are announced to the
//      reducer, whose communication thread all-reduces full buckets while
//      backward goes on (the one all-reduce of the step, in buckets);
//   4. wait for the buckets still in flight, then the optimizer step,
//      identical everywhere.
#include "replica.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>

#include "atoms.h"
#include "evaluate.h"
#include "event_recorder.h"
#include "guards.h"
#include "lockstep/ddp/grad_clip.h"
#include "lockstep/ddp/reducer.h"
#include "lockstep/nn/loss.h"
#include "replica_clock.h"
#include "shard_layout.h"
#include "synced_buffers.h"

namespace lockstep::train::detail {

ReplicaOutput run_replica(const Shared& s, comm::Communicator& comm) {
  const int rank = comm.rank();
  TrainConfig c = s.settings;          // this replica's own copy: the handshake compares them
  const TrainConfig& from = s.config;  // the starting state (initial_*), shared
  if (s.hooks.on_replica_config) s.hooks.on_replica_config(rank, c);
  const data::Dataset& train = s.data.train;
  ReplicaOutput out;

  auto model = make_model(c, train.features, train.num_classes);
  // --zero 1: this replica's optimizer holds state only for its own chunk of
  // every bucket (Note [Sharded optimizer state] below).
  const bool sharded = c.zero == 1 && comm.size() > 1;
  std::vector<optim::ParamRange> owned;
  std::size_t owned_numel = model->layout().numel();
  if (sharded) {
    owned_numel = 0;
    for (const auto& r : ddp::owned_ranges(planned_buckets(c, model->layout()), rank, comm.size())) {
      owned.push_back({r.offset, r.numel});
      owned_numel += r.numel;
    }
  }
  auto optimizer = make_optimizer(c, owned_numel);
  auto params = model->params();
  auto grads = model->grads();

  // Before anything else crosses: do all replicas run the same thing?
  auto fields = handshake_fields(c, s.data, s.total_steps, *model, planned_buckets(c, model->layout()),
                                 s.inputs_digest);
  // Whether checkpoints are taken decides which steps compare the replicas
  // (a collective), so every rank must take them alike.
  const bool checkpointing = static_cast<bool>(s.hooks.on_checkpoint);
  fields.push_back(
      {"--checkpoint (--checkpoint-every)",
       checkpointing ? "on, every " + std::to_string(c.checkpoint_every) + " steps and epoch ends" : "off"});
  ddp::handshake(comm, fields);
  out.handshake_fields = fields.size();
  // Rank 0 writes the trace and the SVG, so over processes its command line
  // decides whether every rank records its events (a --trace given to some
  // hosts' ranks only is then no mismatch); part of the set-up bytes.
  std::uint8_t record = c.record_timeline ? 1 : 0;
  if (s.timeline_from_rank0) comm::broadcast(comm, std::as_writable_bytes(std::span(&record, 1)), 0);
  out.recorded_timeline = record != 0;
  out.traffic.setup = comm.stats().bytes_sent;

  // Weights: made once on rank 0, broadcast once, verified, never exchanged again.
  if (rank == 0) {
    model->init(c.seed);  // the buffers' defaults (running variance 1) under --init too
    if (from.initial_params) std::memcpy(params.data(), from.initial_params->data(), params.size_bytes());
    if (from.initial_buffers && !from.initial_buffers->empty())  // (an empty vector's data() may be null)
      std::memcpy(model->buffers().data(), from.initial_buffers->data(), model->buffers().size_bytes());
  }
  auto before_setup = comm.stats().bytes_sent;
  comm::broadcast(comm, params, 0);
  // Buffers too (batch norm's running statistics start at 0 and 1 on rank 0
  // only): every replica starts from the same state.
  if (!model->buffers().empty()) comm::broadcast(comm, model->buffers(), 0);
  // Going on from a checkpoint: its optimizer state, rank 0's like the
  // weights (broadcast whole, or under --zero 1 scattered, each replica its
  // shard), each replica's own part of what the replicas hold differently,
  // and the count of updates, which every rank's config holds.
  if (from.initial_optimizer_state) {
    const auto before = comm.stats().bytes_sent;
    if (!sharded) {
      if (rank == 0) optimizer->restore(*from.initial_optimizer_state, c.initial_optimizer_steps);
      comm::broadcast(comm, optimizer->state(), 0);
      if (rank != 0) optimizer->restore(optimizer->state(), c.initial_optimizer_steps);
    } else {  // --zero 1: rank 0 scatters the whole state, slot by slot, each replica its own shard
      const ShardLayout shards(planned_buckets(c, model->layout()), comm.size());
      const std::size_t slots = optimizer->slot_names().size(), P = params.size();
      const std::size_t mine = slots == 0 ? 0 : optimizer->state().size() / slots;
      std::vector<float> block(shards.widest),
          blocks(rank == 0 ? std::size_t(comm.size()) * shards.widest : 0);
      for (std::size_t k = 0; k < slots; ++k) {
        for (int r = 0; rank == 0 && r < comm.size(); ++r) {
          shards.pack(std::span<const float>(*from.initial_optimizer_state).subspan(k * P, P), r,
                      std::span(blocks).subspan(std::size_t(r) * shards.widest, shards.widest));
        }
        comm::scatter(comm, blocks, block, 0);
        std::copy_n(block.begin(), mine, optimizer->state().begin() + std::ptrdiff_t(k * mine));
      }
      optimizer->restore(optimizer->state(), c.initial_optimizer_steps);
    }
    // --bn-stats local: every replica's own statistics, replica r's at r x B
    // on rank 0 (train() checked them there; the other ranks' are not read).
    if (replicas_keep_own_buffers(c, *model)) {
      const auto buffers = model->buffers();
      comm::scatter(comm, rank == 0 ? *from.initial_replica_buffers : std::span<const float>(), buffers, 0);
    }
    out.traffic.resume = comm.stats().bytes_sent - before;
  }
  out.traffic.init_broadcast = comm.stats().bytes_sent - before_setup - out.traffic.resume;
  before_setup = comm.stats().bytes_sent;
  verify_broadcast_weights(comm, *model);
  Guards guards(c, s.hooks, comm, *model, *optimizer);

  std::vector<std::size_t> numels;
  for (const auto& t : model->layout().tensors()) numels.push_back(t.numel);
  // Overlap auto: off only for the in-process shared-memory path, whose
  // "communication" is memory work by the cores that compute.
  const bool shared_memory = comm.native_allreduce() != nullptr && comm.native_allreduce()->shares_memory();
  ddp::Reducer reducer(comm, grads, numels,
                       {.first_bucket_mb = c.first_bucket_mb,
                        .bucket_mb = c.bucket_mb,
                        .algorithm = c.algorithm,
                        .compression = c.compression,
                        .overlap = c.overlap == Overlap::On || (c.overlap == Overlap::Auto && !shared_memory),
                        .shard = sharded});
  out.traffic.setup += comm.stats().bytes_sent - before_setup;  // weight verification, bucket layout check
  // --compress bf16, resumed: every replica's own rounding error, replica r's at r x P.
  if (from.initial_optimizer_state && c.compression == ddp::Compression::Bf16) {
    const auto before = comm.stats().bytes_sent;
    std::vector<float> mine(params.size());
    comm::scatter(comm, rank == 0 ? *from.initial_error_feedback : std::span<const float>(), mine, 0);
    reducer.restore_error_feedback(mine);
    out.traffic.resume += comm.stats().bytes_sent - before;
  }
  out.buckets = reducer.buckets();
  // --clip-grad-norm: Note [Clipping the averaged gradient] (ddp/grad_clip.cpp).
  std::optional<ddp::GradClipper> clipper;
  if (c.clip_grad_norm > 0) {
    clipper.emplace(reducer.buckets(), rank, comm.size(), grads.size(),
                    ddp::GradClipOptions{
                        .max_norm = c.clip_grad_norm, .sharded = sharded, .deterministic = c.deterministic});
  }
  double window_norm = -1;  // the largest gradient norm since the last progress point (-1: none)
  std::int64_t window_clipped = 0;
  out.overlapped = c.overlap == Overlap::On || (c.overlap == Overlap::Auto && !shared_memory);
  std::vector<std::string> layer_names;
  for (std::size_t i = 0; i < model->layer_count(); ++i) {
    layer_names.push_back(std::to_string(i) + " " + model->layer(i).describe());
  }
  // Note [Non-finite sentinel] (guards.h), sharded: the flag rides at the
  // start of every rank's chunk of the last bucket, the one tensor 0 is in.
  std::vector<std::size_t> sentinel_at;
  std::size_t sentinel_mine = 0;
  if (sharded && !c.deterministic) {
    const auto& last = reducer.buckets().back();  // plan() checked it has a value for every rank
    for (int r = 0; r < comm.size(); ++r)
      sentinel_at.push_back(last.offset + comm::shard_range(last.numel, r, comm.size()).first);
    sentinel_mine = sentinel_at[static_cast<std::size_t>(rank)];
  }
  Recorder recorder(out.recorded_timeline, rank, s.t0);
  auto buffers = model->buffers();
  const bool sync_buffers = c.bn_stats == BnStats::Sync && !buffers.empty() && !c.deterministic;
  const bool local_buffers = replicas_keep_own_buffers(c, *model);
  std::vector<float> buffers_at_step(c.deterministic || sync_buffers ? buffers.size() : 0);
  std::vector<float> buffer_update(sync_buffers ? buffers.size() : 0);
  const std::vector<std::size_t> buffer_counters = counter_offsets(model->buffer_layout());
  std::vector<float> atom_vector(c.deterministic ? params.size() + 1 + buffers.size() : 0);
  AtomTree atoms(atom_vector.size());

  const std::int64_t features = train.features, classes = train.num_classes;
  const std::int64_t shard_capacity = c.micro_batch * c.accumulate;  // the sampler's micro-batch
  std::vector<float> x(static_cast<std::size_t>(shard_capacity * features + features));
  std::vector<std::int32_t> y(static_cast<std::size_t>(shard_capacity + 1));
  std::vector<std::int64_t> sample_ids(static_cast<std::size_t>(shard_capacity + 1));
  std::vector<float> dlogits(static_cast<std::size_t>((shard_capacity + 1) * classes));
  std::vector<std::int64_t> order;
  double window[2] = {0, 0};  // loss sum, samples since the last report
  std::size_t window_first_step = 0;
  std::int64_t window_start = c.start_step;  // the first step the loss window holds
  // A resumed run's first window is cut short unless the step before it
  // ended a window in the unbroken run too (a progress point: every
  // log_every steps and each epoch's end).
  const bool first_window_cut =
      c.start_step > 0 && c.start_step % c.log_every != 0 && c.start_step % s.sampler.steps_per_epoch() != 0;
  // Note [Paced stop votes]: the replicas must stop after the same step, so
  // a stop request is a vote, an all-reduce. Voting only at progress points
  // (every --log-every steps) left a Ctrl-C unheard for up to 50 steps: 0.4 s
  // for the default MLP, minutes for a model of a second a step. So they
  // also vote after the first step, and then every stop_poll_ms (1 s) worth
  // of steps, by the mean step time since the last vote (not the last step's:
  // an epoch's short last step would stretch the interval), which the vote
  // itself sums, so every replica computes the same next vote step. A stop
  // at such a vote ends the run as at a progress point (the window's loss,
  // the test set), so the vote carries the window's tallies too. Four floats
  // (two under --deterministic), once a second or once every log_every steps,
  // whichever comes first: nothing against a step's gradients.
  std::int64_t next_vote = c.start_step, last_vote = c.start_step - 1;
  double ms_since_vote = 0;  // this replica's step times since last_vote: the pace is their mean
  auto start = Clock::now();
  double eval_seconds = 0;
  std::int64_t samples = 0;  // global samples processed by the group since `start`

  out.epochs_run = c.start_step / s.sampler.steps_per_epoch();
  out.steps_run = c.start_step;
  for (std::int64_t step = c.start_step; step < s.total_steps; ++step) {
    if (step == s.warmup_steps && step > 0) {  // restart the clock after warm-up
      start = Clock::now();
      samples = 0;
      eval_seconds = 0;
    }
    guards.maybe_throw(step);
    const auto t_step = Clock::now();
    const std::int64_t epoch = step / s.sampler.steps_per_epoch();
    const std::int64_t in_epoch = step % s.sampler.steps_per_epoch();
    const std::int64_t n = comm.size();
    if (in_epoch == 0 || step == c.start_step) order = s.sampler.epoch_order(epoch);
    const ddp::Shard shard = s.sampler.shard(in_epoch, guards.shard_rank());
    guards.plan_step(order, s.sampler.shard(in_epoch, 0).begin, s.sampler.shard(in_epoch, int(n) - 1).end);
    const std::int64_t b = shard.size();
    // Pad: every replica computes the largest shard's rows; the padding
    // (zeros, masked out of the loss) contributes exactly nothing.
    const std::int64_t rows = c.ragged == Ragged::Pad ? (shard.global_count + n - 1) / n : b;

    for (std::int64_t i = 0; i < b; ++i) {  // gather this replica's own samples
      const std::int64_t idx = order[static_cast<std::size_t>(shard.begin + i)];
      std::memcpy(&x[i * features], train.input(idx).data(), features * sizeof(float));
      y[i] = train.labels[idx];
      sample_ids[i] = idx;
      guards.read_sample(idx);
    }
    for (std::int64_t i = b; i < rows; ++i) sample_ids[i] = train.size + i;  // padding: masked anyway
    if (rows > b) {
      std::fill(x.begin() + b * features, x.begin() + rows * features, 0.0f);
      std::fill(y.begin() + b, y.begin() + rows, 0);
    }

    bool nonfinite = false;  // in this replica's own gradient, before the all-reduce
    // Past this magnitude a local gradient could overflow the sum over the
    // replicas (the reducer's weights add up to n), or over the step's atoms
    // (--deterministic): counted as non-finite (Note [Non-finite sentinel]).
    const float overflow = overflow_limit(
        c.deterministic ? (shard.global_count + c.atom - 1) / std::max<std::int64_t>(1, c.atom) : n);
    bool inject_nan = guards.injects(Fault::Kind::NaN, step);
    double loss_sum = 0;           // this replica's (deterministic mode: the group's, bit-exact)
    auto t_backward_end = t_step;  // the last layer's backward, before its gradients are announced
    auto t_wait_end = t_step;      // the gradients are reduced
    // Where the step began waiting on communication: the end of backward
    // (buckets may still be in flight); under --deterministic, the start of
    // the tree all-reduce, since summing the atoms before it is compute.
    auto t_wait_start = t_step;
    double buffers_exposed_ms = 0;  // --bn-stats sync: the buffers' all-reduce, after the gradients'
    StepSample sample;
    // One forward and backward over rows [lo, lo + m), `real` of them not
    // padding; adds grad_scale x the loss sum's gradient into grads.
    // on_layer_done(layer) runs after each layer's backward.
    const auto forward_backward = [&](std::int64_t lo, std::int64_t m, std::int64_t real, float grad_scale,
                                      const std::function<void(std::size_t)>& on_layer_done) {
      auto t = Clock::now();
      // Random streams (dropout) are keyed by the global sample index, never by rank.
      const nn::ForwardContext ctx{c.seed, static_cast<std::uint64_t>(step),
                                   std::span(sample_ids).subspan(lo, m), real};
      auto logits = model->forward(
          std::span<const float>(&x[lo * features], m * features), m,
          [&](std::size_t layer) {
            const auto done = Clock::now();
            recorder.add(Track::Compute, Phase::Forward, step, "forward " + layer_names[layer], t, done, 0,
                         int(layer));
            t = done;
          },
          ctx);
      auto loss = nn::softmax_cross_entropy(logits.data(), &y[lo], real, classes, dlogits.data(), grad_scale);
      std::fill(dlogits.begin() + real * classes, dlogits.begin() + m * classes, 0.0f);
      auto now = Clock::now();
      recorder.add(Track::Compute, Phase::Forward, step, "loss", t, now);
      t = now;
      // Adds into the gradients the previous optimizer step left at zero.
      model->backward(std::span<const float>(dlogits.data(), m * classes), m, /*accumulate=*/true,
                      [&](std::size_t layer) {
                        const auto done = Clock::now();
                        recorder.add(Track::Compute, Phase::Backward, step, "backward " + layer_names[layer],
                                     t, done, 0, int(layer));
                        t = t_backward_end = done;
                        if (on_layer_done) on_layer_done(layer);
                      });
      return loss.loss_sum;
    };

    if (c.deterministic) {  // Note [Bit-exact for any replica count] (atoms.h)
      const std::size_t np = params.size(), nb = buffers.size();
      std::copy(buffers.begin(), buffers.end(), buffers_at_step.begin());
      for (std::int64_t lo = 0; lo < b; lo += c.atom) {
        std::copy(buffers_at_step.begin(), buffers_at_step.end(), buffers.begin());
        std::fill(grads.begin(), grads.end(), 0.0f);
        const double atom_loss =
            forward_backward(lo, c.atom, c.atom, 1.0f, nullptr);  // the sum, not the mean
        if (inject_nan) grads[grads.size() / 2] = std::numeric_limits<float>::quiet_NaN();
        inject_nan = false;
        nonfinite = nonfinite || has_nonfinite(grads, overflow);
        std::copy(grads.begin(), grads.end(), atom_vector.begin());
        atom_vector[np] = static_cast<float>(atom_loss);
        for (std::size_t j = 0; j < nb; ++j) atom_vector[np + 1 + j] = buffers[j] - buffers_at_step[j];
        atoms.add(atom_vector);
      }
      auto total = atoms.total();
      mark_nonfinite_sentinel(total, nonfinite);
      const auto t_comm = Clock::now();
      t_wait_start = t_comm;
      const auto sent = comm.stats().bytes_sent;
      const auto messages = comm.stats().messages_sent;
      // Both sum in the one tree over ranks; in one process, shared memory moves the least memory.
      comm::NativeAllreduce* native = comm.native_allreduce();
      const auto tree = native != nullptr && native->shares_memory() ? comm::Algorithm::SharedMemory
                                                                     : comm::Algorithm::Tree;
      comm::allreduce(
          comm, total,
          {.op = comm::ReduceOp::Sum, .algorithm = tree, .global_batch = std::uint64_t(shard.global_count)});
      t_wait_end = Clock::now();
      out.traffic.gradients += comm.stats().bytes_sent - sent;
      out.traffic.gradient_messages += comm.stats().messages_sent - messages;
      sample.comm = ms_between(t_comm, t_wait_end);
      sample.spans.emplace_back(t_comm, t_wait_end);
      recorder.add(Track::Comm, Phase::Allreduce, step, "allreduce (tree order)", t_comm, t_wait_end,
                   comm.stats().bytes_sent - sent);
      const float global = static_cast<float>(shard.global_count);
      for (std::size_t i = 0; i < np; ++i) grads[i] = total[i] / global;  // the one division
      loss_sum = total[np];
      const float global_atoms = static_cast<float>(shard.global_count / c.atom);
      for (std::size_t j = 0; j < nb; ++j) buffers[j] = buffers_at_step[j] + total[np + 1 + j] / global_atoms;
    } else {
      if (sync_buffers) std::copy(buffers.begin(), buffers.end(), buffers_at_step.begin());
      reducer.begin_step(b, shard.global_count);
      for (std::int64_t k = 0; k < c.accumulate; ++k) {  // micro-steps: rows [lo, hi)
        const std::int64_t lo = rows * k / c.accumulate, hi = rows * (k + 1) / c.accumulate, m = hi - lo;
        const bool last = k == c.accumulate - 1;
        const std::int64_t real = std::max<std::int64_t>(0, std::min(hi, b) - lo);  // rows before the padding
        loss_sum += forward_backward(lo, m, real, b > 0 ? 1.0f / float(b) : 0.0f, [&](std::size_t layer) {
          if (!last) return;
          const auto range = model->layer_tensors(layer);
          for (std::size_t i = range.end; i-- > range.first;) {
            // Scanned before the reducer owns it (and reduces it in place).
            const auto& t = model->layout().tensors()[i];
            if (inject_nan) grads[t.offset] = std::numeric_limits<float>::quiet_NaN();
            inject_nan = false;
            nonfinite = nonfinite || has_nonfinite(grads.subspan(t.offset, t.numel), overflow);
            if (i == 0) mark_nonfinite_sentinel(grads, nonfinite, sentinel_at);  // the last one announced
            reducer.mark_ready(i);
          }
        });
      }
      const auto& timing = reducer.finish_step();
      // The step waited for communication until the last all-reduce ended,
      // not until this thread ran again: with more replicas than cores the
      // OS may run others first, and that is counted as compute (as in
      // backward), not as communication.
      t_wait_start = t_wait_end = t_backward_end;
      for (const auto& bt : timing.buckets) t_wait_end = std::max(t_wait_end, bt.end);
      t_wait_end = std::min(t_wait_end, Clock::now());
      for (std::size_t k = 0; k < timing.buckets.size(); ++k) {
        const auto& bt = timing.buckets[k];
        sample.comm += ms_between(bt.start, bt.end);
        sample.spans.emplace_back(bt.start, bt.end);
        out.traffic.gradients += bt.bytes_sent;
        out.traffic.gradient_messages += bt.messages_sent;
        recorder.add(Track::Comm, Phase::Allreduce, step,
                     (sharded ? "reduce-scatter bucket " : "allreduce bucket ") + std::to_string(k), bt.start,
                     bt.end, bt.bytes_sent);
      }
      if (sync_buffers) {  // --bn-stats sync: Note [Synchronised buffers]
        for (std::size_t j = 0; j < buffers.size(); ++j) buffer_update[j] = buffers[j] - buffers_at_step[j];
        const bool equal_shards =
            shard.global_count % n == 0;  // the sampler's shards are as even as possible
        if (!equal_shards)
          for (auto& u : buffer_update) u *= static_cast<float>(b);
        const auto sent = comm.stats().bytes_sent;
        const auto t_buffers = Clock::now();
        comm::allreduce(comm, buffer_update,
                        {.op = equal_shards ? comm::ReduceOp::Mean : comm::ReduceOp::Sum});
        const auto t_buffers_end = Clock::now();
        out.traffic.buffers += comm.stats().bytes_sent - sent;
        if (!equal_shards) {
          for (auto& u : buffer_update) u /= static_cast<float>(shard.global_count);
          // The step counters count forwards, not samples (Note [Synchronised buffers]).
          const auto forwards = static_cast<float>(micro_steps_with_samples(
              s.sampler, in_epoch, int(n), c.accumulate, c.ragged == Ragged::Pad));
          for (const std::size_t j : buffer_counters) buffer_update[j] = forwards;
        }
        for (std::size_t j = 0; j < buffers.size(); ++j) buffers[j] = buffers_at_step[j] + buffer_update[j];
        // Exposed too, after the gradients': on this thread, after backward.
        sample.comm += ms_between(t_buffers, t_buffers_end);
        sample.spans.emplace_back(t_buffers, t_buffers_end);
        buffers_exposed_ms = ms_between(t_buffers, t_buffers_end);
        recorder.add(Track::Comm, Phase::Allreduce, step, "allreduce buffers", t_buffers, t_buffers_end,
                     comm.stats().bytes_sent - sent);
        recorder.add(Track::Compute, Phase::Exposed, step, "exposed comm (buffers)", t_buffers,
                     t_buffers_end);
      }
    }
    if (t_wait_end > t_wait_start) {
      recorder.add(Track::Compute, Phase::Exposed, step, "exposed comm", t_wait_start, t_wait_end);
    }

    const auto t_optimizer_start = Clock::now();
    bool optimizer_recorded = false;  // sharded: recorded before the all-gather
    const float lr = optim::learning_rate(c.schedule, c.lr, step, s.total_steps, c.lr_warmup);
    double gather_ms = 0;  // --zero 1: the weights' all-gather, exposed after the optimizer
    const bool skipped =
        guards.skip_step(step, reduced_nonfinite_sentinel(grads, sentinel_mine), nonfinite, grads, out);
    double clip_ms = 0;        // --clip-grad-norm with --zero 1: the norm's exchange, exposed
    if (clipper && skipped) {  // one entry per step run: NaN for a skipped step (null in the report)
      out.grad_norms.push_back(std::numeric_limits<double>::quiet_NaN());
    } else if (clipper) {  // the same norm on every replica, so the same factor
      double sum = clipper->local_sum(grads);
      if (clipper->exchanges()) {
        const auto before = comm.stats().bytes_sent;
        const auto t_clip = Clock::now();
        sum = clipper->total_sum(comm, sum);
        const auto t_clipped = Clock::now();
        const std::uint64_t sent = comm.stats().bytes_sent - before;
        out.traffic.clip += sent;
        clip_ms = ms_between(t_clip, t_clipped);
        sample.comm += clip_ms;
        sample.spans.emplace_back(t_clip, t_clipped);
        recorder.add(Track::Comm, Phase::Allreduce, step, "all-reduce gradient norm", t_clip, t_clipped,
                     sent);
        recorder.add(Track::Compute, Phase::Exposed, step, "exposed comm (gradient norm)", t_clip, t_clipped);
      }
      const auto clip = clipper->scale(grads, sum);
      out.grad_norms.push_back(clip.norm);
      out.clipped_steps += clip.clipped ? 1 : 0;
      window_norm = std::max(window_norm, clip.norm);
      window_clipped += clip.clipped ? 1 : 0;
    }
    if (skipped) {
      reducer.discard_error_feedback();  // a skipped gradient's rounding must not reach the next step
    } else if (!sharded) {
      optimizer->step_and_zero_grads(params, grads, lr);
    } else {
      // Note [Sharded optimizer state]: this replica updates only its own
      // chunk of every bucket, from the mean the reduce-scatter left there
      // (under --deterministic, from the all-reduced mean), with its shard
      // of the optimizer state; then every replica's chunks are all-gathered,
      // and all hold the same weights again. Each element's update is the
      // same arithmetic on the same values as without sharding, so the same bits.
      optimizer->step_ranges_and_zero_grads(params, grads, owned, lr);
      const auto t_gather = Clock::now();
      recorder.add(Track::Compute, Phase::Optimizer, step, "optimizer (own shard)", t_optimizer_start,
                   t_gather);
      const auto sent = comm.stats().bytes_sent;
      reducer.gather(params);
      const auto t_gathered = Clock::now();
      out.traffic.weights += comm.stats().bytes_sent - sent;
      gather_ms = ms_between(t_gather, t_gathered);
      sample.comm += gather_ms;
      sample.spans.emplace_back(t_gather, t_gathered);
      recorder.add(Track::Comm, Phase::Allreduce, step, "all-gather weights", t_gather, t_gathered,
                   comm.stats().bytes_sent - sent);
      recorder.add(Track::Compute, Phase::Exposed, step, "exposed comm (weights)", t_gather, t_gathered);
      optimizer_recorded = true;
    }
    guards.maybe_flip_bit(step, params, buffers);
    const auto t_optimizer_end = Clock::now();
    if (!optimizer_recorded)
      recorder.add(Track::Compute, Phase::Optimizer, step, "optimizer", t_optimizer_start, t_optimizer_end);
    if (s.hooks.on_replica_step) s.hooks.on_replica_step(rank, step, params, optimizer->state());
    const bool last_step = step == s.total_steps - 1;
    const bool epoch_end = in_epoch == s.sampler.steps_per_epoch() - 1 || last_step;
    // A checkpoint keeps rank 0's state as everyone's: compared first, so a
    // replica that diverged is caught (or repaired) before it is kept. Its
    // reads are audited first too, even with the detector off (--check-every
    // 0): Note [Audit before a checkpoint].
    const bool checkpoint_step =
        checkpointing && ((c.checkpoint_every > 0 && (step + 1) % c.checkpoint_every == 0) || epoch_end);
    const bool checked = guards.check(step, epoch_end || checkpoint_step, last_step || checkpoint_step,
                                      params, optimizer->state(), buffers, out);  // in the step's time
    const auto t_end = Clock::now();
    if (checked) sample.check = ms_between(t_optimizer_end, t_end);
    sample.step = ms_between(t_step, t_end);
    sample.exposed = ms_between(t_wait_start, t_wait_end) + buffers_exposed_ms + gather_ms + clip_ms;
    sample.compute = sample.step - sample.exposed;
    out.steps.push_back(sample);

    window[0] += loss_sum;
    window[1] += double(c.deterministic ? shard.global_count : b);  // deterministic: already the group's
    samples += shard.global_count;
    bool stop = false;  // TrainHooks::stop_requested on any replica: agreed here (Note [Paced stop votes])
    const bool progress_point = (step + 1) % c.log_every == 0 || epoch_end;
    ms_since_vote += sample.step;
    if (progress_point || step == next_vote) {
      const auto before_ctl = comm.stats().bytes_sent;
      // {stop votes, this replica's mean step since the last vote in whole ms,
      // the window's loss sum and samples}, summed. Whole ms: a float sum of
      // integers under 2^24 is exact in any order, so every replica reads the
      // same pace whatever the all-reduce (next_vote must agree, or the
      // replicas would call different collectives).
      const double mean_ms = std::round(ms_since_vote / double(step - last_vote));
      double tallies[4] = {s.hooks.stop_requested && s.hooks.stop_requested() ? 1.0 : 0.0, mean_ms, window[0],
                           window[1]};
      // Deterministic: the loss was summed in the tree already, the window is the group's.
      allreduce_tallies(comm, std::span(tallies, c.deterministic ? 2 : 4));
      stop = tallies[0] > 0 && !last_step;
      // A stop ends the run here as at a progress point: its loss, its evaluation.
      if ((progress_point || stop) && !c.deterministic) window[0] = tallies[2], window[1] = tallies[3];
      const double step_ms = std::max(tallies[1] / comm.size(), 1e-3);
      const double steps_per_poll =
          std::min({c.stop_poll_ms / step_ms, double(c.log_every), double(s.total_steps - step)});
      next_vote = step + std::max<std::int64_t>(1, static_cast<std::int64_t>(steps_per_poll));
      last_vote = step;
      ms_since_vote = 0;
      out.traffic.control += comm.stats().bytes_sent - before_ctl;
    }
    if (progress_point || stop) {
      const auto before_ctl = comm.stats().bytes_sent;
      Progress p{epoch,
                 step + 1,
                 s.total_steps,
                 window[0] / window[1],
                 0,
                 lr,
                 median_times(std::span(out.steps).subspan(window_first_step)),
                 std::nullopt};
      if (clipper && window_norm >= 0) p.grad_norm = window_norm;
      p.clipped = window_clipped;
      window_norm = -1;
      window_clipped = 0;
      window_first_step = out.steps.size();
      out.final_loss = p.loss;
      out.final_loss_first_step = window_start;
      out.final_loss_window_cut = first_window_cut && window_start == c.start_step;
      window_start = step + 1;
      window[0] = window[1] = 0;
      if ((epoch_end || stop) && c.evaluate) {  // stopped: the weights the run ends with
        const auto t0 = Clock::now();
        p.test_accuracy = evaluate(comm, *model, s.data.test);
        eval_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
        out.epoch_test_accuracy.push_back(*p.test_accuracy);
      }
      out.traffic.control += comm.stats().bytes_sent - before_ctl;
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count() - eval_seconds;
      p.samples_per_s = double(samples) / elapsed;
      if (rank == 0 && s.hooks.on_progress) s.hooks.on_progress(p);
    }
    if (in_epoch == s.sampler.steps_per_epoch() - 1) out.epochs_run = epoch + 1;  // completed
    out.steps_run = step + 1;
    if (stop) {
      // The run ends here as at its last step: the weights it ends with are
      // compared, and the samples since the last check accounted for.
      if (!checked)
        guards.check(step, /*epoch_end=*/true, /*last_step=*/true, params, optimizer->state(), buffers, out);
      out.stopped_early = true;
    }
    if (checkpointing && (checkpoint_step || stop)) {
      // What the replicas hold differently, gathered to rank 0 first (every
      // rank takes part; only rank 0 keeps the whole).
      const auto before = comm.stats().bytes_sent;
      const std::size_t n = std::size_t(comm.size()), P = params.size();
      std::vector<float> whole_state, replica_buffers, error_feedback;
      if (sharded) {  // the whole optimizer state: every replica's shard of each slot, padded
        const ShardLayout shards(reducer.buckets(), comm.size());
        const std::size_t slots = optimizer->slot_names().size();
        const std::size_t mine = slots == 0 ? 0 : optimizer->state().size() / slots;
        std::vector<float> block(shards.widest), blocks(rank == 0 ? n * shards.widest : 0);
        if (rank == 0) whole_state.resize(slots * P);
        for (std::size_t k = 0; k < slots; ++k) {
          std::copy_n(optimizer->state().begin() + std::ptrdiff_t(k * mine), mine, block.begin());
          comm::gather(comm, block, blocks, 0);
          for (int r = 0; rank == 0 && r < comm.size(); ++r) {
            shards.unpack(std::span(blocks).subspan(std::size_t(r) * shards.widest, shards.widest), r,
                          std::span(whole_state).subspan(k * P, P));
          }
        }
      }
      if (local_buffers) {
        replica_buffers.resize(rank == 0 ? buffers.size() * n : 0);
        comm::gather(comm, buffers, replica_buffers, 0);
      }
      if (c.compression == ddp::Compression::Bf16) {
        error_feedback.resize(rank == 0 ? P * n : 0);
        comm::gather(comm, reducer.error_feedback(), error_feedback, 0);
      }
      out.traffic.checkpoint += comm.stats().bytes_sent - before;
      if (rank == 0) {
        s.hooks.on_checkpoint(
            {.steps_done = step + 1,
             .steps_planned = s.total_steps,
             .optimizer_steps = optimizer->steps_taken(),
             .skips_in_a_row = guards.skips_in_a_row(),
             .layout = &model->layout(),
             .buffer_layout = &model->buffer_layout(),
             .slot_names = optimizer->slot_names(),
             .params = params,
             .buffers = buffers,
             .optimizer_state = sharded ? std::span<const float>(whole_state) : optimizer->state(),
             .replica_buffers = replica_buffers,
             .error_feedback = error_feedback});
      }
    }
    if (stop) break;
  }
  if (!out.stopped_early)
    guards.maybe_throw(s.total_steps);  // --inject throw@<steps>: after the last checkpoint
  // Note [A job that had ended]
  // A job whose every step is done can still fail after its last checkpoint:
  // a rank lost while the outputs are gathered or written. The job
  // restarted from that checkpoint (launch --max-restarts, train
  // --auto-resume) has no step left, and must still end as the unbroken job:
  // the weights, their test accuracy, --save. So start_step may be the run's
  // last (IfEnded::Finish): no step runs, the weights are evaluated as the
  // last step would have, and the loss is not known (NaN: the checkpoint
  // keeps none). What describes steps (timings, the trace, a profile) is
  // empty, and the command says so.
  if (out.steps_run == c.start_step && c.start_step == s.total_steps) {
    out.final_loss = std::numeric_limits<double>::quiet_NaN();
    const auto t0 = Clock::now();
    const auto before_ctl = comm.stats().bytes_sent;
    if (c.evaluate) out.epoch_test_accuracy.push_back(evaluate(comm, *model, s.data.test));
    out.traffic.control += comm.stats().bytes_sent - before_ctl;  // as at a progress point
    eval_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  out.train_seconds = std::chrono::duration<double>(Clock::now() - start).count() - eval_seconds;
  const auto st = comm.stats();
  out.traffic.unaccounted = st.bytes_sent - out.traffic.init_broadcast - out.traffic.setup -
                            out.traffic.gradients - out.traffic.control - out.traffic.checks -
                            out.traffic.repair - out.traffic.buffers - out.traffic.weights -
                            out.traffic.resume - out.traffic.checkpoint - out.traffic.clip;
  out.params.assign(params.begin(), params.end());
  out.buffers.assign(buffers.begin(), buffers.end());
  out.events = recorder.take();
  return out;
}

}  // namespace lockstep::train::detail
