#include "assemble_result.h"

#include <algorithm>
#include <iterator>
#include <span>
#include <type_traits>

#include "guards.h"

namespace lockstep::train::detail {

// The result from the outputs of the replicas this process ran. `outputs[0]`
// gives the run's shared view (losses and accuracies are all-reduced, so
// every replica holds the same); traffic, step times and the timeline are
// gathered from all of them.
TrainResult assemble(const TrainConfig& c, const Plan& p, std::vector<detail::ReplicaOutput>& outputs) {
  TrainResult res;
  const auto& o = outputs[0];
  const auto& sampler = p.sampler;
  res.replicas = c.replicas;
  res.micro_batch = c.micro_batch;
  res.accumulate = c.accumulate;
  res.global_batch = sampler.global_batch();
  res.steps = o.steps_run;  // p.total_steps, unless stopped early
  res.steps_planned = p.total_steps;
  res.stopped_early = o.stopped_early;
  res.resumed_from_step = c.start_step;
  res.epochs_run = o.epochs_run;
  res.epochs = double(res.steps) / double(sampler.steps_per_epoch());
  res.final_loss = o.final_loss;
  if (o.steps_run > c.start_step) {  // a run of no step (Note [A job that had ended]) has no window
    res.final_loss_first_step = o.final_loss_first_step + 1;
    res.final_loss_last_step = o.steps_run;
    res.final_loss_window_cut = o.final_loss_window_cut;
  }
  res.epoch_test_accuracy = o.epoch_test_accuracy;
  if (!o.epoch_test_accuracy.empty()) res.test_accuracy = o.epoch_test_accuracy.back();
  res.train_seconds = o.train_seconds;
  res.samples_seen = 0;
  for (std::int64_t step = 0; step < res.steps; ++step)
    res.samples_seen += sampler.shard(step % sampler.steps_per_epoch(), 0).global_count;
  // Only when the run reaches it.
  if (const auto last = sampler.shard(sampler.steps_per_epoch() - 1, 0);
      last.global_count < res.global_batch && res.steps >= sampler.steps_per_epoch()) {
    res.last_step_samples = last.global_count;
    res.last_step_min_shard = res.last_step_max_shard = last.end - last.begin;
    for (int r = 1; r < c.replicas; ++r) {
      const auto shard = sampler.shard(sampler.steps_per_epoch() - 1, r);
      res.last_step_min_shard = std::min(res.last_step_min_shard, shard.end - shard.begin);
      res.last_step_max_shard = std::max(res.last_step_max_shard, shard.end - shard.begin);
    }
  }
  if (const std::int64_t left = sampler.dataset_size() - sampler.steps_per_epoch() * sampler.global_batch();
      left > 0 && res.last_step_samples == 0 && res.steps >= sampler.steps_per_epoch()) {
    res.samples_dropped_per_epoch = left;  // --ragged drop, --deterministic: never formed
  }
  std::int64_t timed_samples = 0;
  // The clock restarts when step `warmup` begins (run_replica), if the run
  // reaches it after its first step; otherwise it was timed from its first.
  const std::int64_t first_timed = p.warmup > c.start_step && res.steps > p.warmup ? p.warmup : c.start_step;
  for (std::int64_t step = first_timed; step < res.steps; ++step)
    timed_samples += sampler.shard(step % sampler.steps_per_epoch(), 0).global_count;
  res.samples_per_s =
      timed_samples > 0 ? double(timed_samples) / o.train_seconds : 0;  // none: a run that had ended
  res.flops_per_sample = p.probe->train_flops_per_sample();
  res.mfu = c.peak_flops > 0 ? res.samples_per_s * res.flops_per_sample / c.peak_flops : 0;
  res.param_count = p.probe->layout().numel();
  res.weight_bytes = p.probe->layout().bytes();
  res.grad_bytes = p.probe->layout().bytes();
  const auto probe_optimizer = make_optimizer(c, p.probe->layout().numel());
  res.optimizer_state_bytes = res.optimizer_state_bytes_whole = probe_optimizer->state().size_bytes();
  res.zero = c.replicas > 1 ? c.zero : 0;
  if (res.zero == 1) {  // the largest shard: chunks differ by up to one value per bucket
    const auto buckets = detail::planned_buckets(c, p.probe->layout());
    const std::size_t slots = probe_optimizer->slot_names().size();
    std::uint64_t largest = 0;
    for (int r = 0; r < c.replicas; ++r) {
      std::uint64_t floats = 0;
      for (const auto& range : ddp::owned_ranges(buckets, r, c.replicas)) floats += range.numel;
      largest = std::max<std::uint64_t>(largest, floats * slots * sizeof(float));
    }
    res.optimizer_state_bytes = largest;
  }
  res.optimizer_description = probe_optimizer->describe();
  // P in the bytes of the wire's type: float32, or bf16 with --compress bf16.
  const std::uint64_t wire_bytes =
      c.compression == ddp::Compression::Bf16 ? res.grad_bytes / 2 : res.grad_bytes;
  res.allreduce_bytes_per_step_formula =
      2 * wire_bytes * static_cast<std::uint64_t>(c.replicas - 1) / c.replicas;
  // One clock for all replicas only when they all ran here.
  if (outputs.size() == static_cast<std::size_t>(c.replicas)) detail::attribute_waits(outputs);
  std::vector<detail::StepSample> samples;
  for (auto& out : outputs) {
    res.traffic.push_back(out.traffic);
    samples.insert(samples.end(), out.steps.begin(), out.steps.end());
    res.timeline.insert(res.timeline.end(), std::make_move_iterator(out.events.begin()),
                        std::make_move_iterator(out.events.end()));
  }
  res.times = detail::median_times(samples);
  res.buckets = o.buckets;
  res.overlapped = o.overlapped;
  res.model_description = p.probe->describe();
  res.layout = p.probe->layout();
  res.buffer_layout = p.probe->buffer_layout();
  res.params = std::move(outputs[0].params);
  res.buffers = std::move(outputs[0].buffers);
  res.handshake_fields = o.handshake_fields;
  res.divergence_checks = o.divergence_checks;
  res.accounting_checks = o.accounting_checks;
  res.buffer_checks_differing = o.buffer_checks_differing;
  res.repairs = o.repairs;
  res.skipped = o.skipped;
  res.grad_norms = o.grad_norms;
  res.clipped_steps = o.clipped_steps;
  return res;
}

// Every rank's traffic, as train() reports it: one small broadcast per rank,
// after the run's own bytes were counted.
std::vector<TrafficBytes> gather_traffic(comm::Communicator& comm, const TrafficBytes& mine) {
  static_assert(std::is_trivially_copyable_v<TrafficBytes>);
  std::vector<TrafficBytes> all(static_cast<std::size_t>(comm.size()));
  all[static_cast<std::size_t>(comm.rank())] = mine;
  for (int r = 0; r < comm.size(); ++r) {
    comm::broadcast(comm, std::as_writable_bytes(std::span(&all[static_cast<std::size_t>(r)], 1)), r);
  }
  return all;
}

}  // namespace lockstep::train::detail
