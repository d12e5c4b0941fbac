// One training step of one replica: compute, the buckets' all-reduces, and
// how much of that communication backward hides.
//
// The model (docs/cost-model.md, "Overlap"): backward runs the layers last to
// first; a layer's gradient is ready when its backward ends. Buckets are the
// trainer's own (ddp::assign_buckets over the layers' sizes), so a bucket is
// ready when its earliest layer's backward ends. One communication stream
// all-reduces the buckets strictly in order: bucket k starts at
// max(ready_k, end_{k-1}). Exposed communication is whatever runs past the
// end of backward; the optimizer starts after it.
//
//   step = accumulate x (forward + backward) + exposed + optimizer
//
// The host (docs/cost-model.md, "The host"):
// - host_latency: the software's own cost of handing one message from one
//   rank to the next (waking the receiver, matching, copying the header),
//   added to every round of every all-reduce on top of the link's latency.
// - Shared cores (host_cores = C > 0): the N replicas time-share C cores, as
//   `lockstep train`'s in-process replicas do. With f = max(1, N/C) > 1 they
//   take turns: the last replica starts its step's compute (f-1) x one
//   replica's forward + backward late and then runs at full speed, so its
//   gradients are ready at that offset plus the unshared times, and overlap
//   can hide communication only behind its own backward. The optimizers of
//   all N run on C cores (f x), every hand-off waits for f turns (f x
//   host_latency per round), and an all-reduce takes at least f x its gamma
//   term (the N replicas' reductions on C cores).
// With either, Algorithm::Best is the cheapest once these terms are added.
//
// Stragglers (docs/cost-model.md, "Stragglers"): with compute_cv = c > 0,
// each replica's compute in a step is mu (1 + c Z), Z standard normal and
// independent across replicas and steps. A synchronous step goes at the pace
// of the slowest: its compute, and every gradient's ready time, stretch by
// 1 + (c / sqrt(accumulate)) E[max of N Z] (K micro-steps average their
// jitter). The optimizer does not wait for anyone and is not stretched.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/cost/collective_cost.h"
#include "lockstep/cost/profile.h"

namespace lockstep::cost {

struct StepOptions {
  int replicas = 1;
  std::int64_t micro_batch = 32;  // the profile's times are rescaled to this, linearly
  std::int64_t accumulate = 1;    // micro-steps per step; one all-reduce, in the last backward
  Topology topology;
  Algorithm algorithm = Algorithm::Best;
  double first_bucket_mb = 1;     // MiB, as ddp::ReducerOptions
  double bucket_mb = 25;          // MiB; 0 = one bucket after backward (no overlap); with Cycles, the
                                  // fusion cap in bytes on the wire, 0 = no fusion (Horovod's threshold 0)
  // As lockstep train with --overlap auto and no bucket flag: with Buckets,
  // one bucket where the replicas fill the shared cores (replicas >= host_cores > 0).
  bool one_bucket_on_shared_cores = false;
  // How gradients are grouped into all-reduces (docs/cost-model.md, "Launch schedules"):
  // - Buckets: lockstep's and PyTorch DDP's; a bucket launches when its last gradient is ready.
  // - PerLayer: one all-reduce per layer, as soon as its gradient is ready (Goyal et al. 2017).
  // - Cycles: Horovod's tensor fusion. A background thread wakes every cycle_ms, agrees with the
  //   other ranks on which gradients are ready (a gather to rank 0 and a broadcast back), and
  //   all-reduces them fused into buffers of at most bucket_mb; the next cycle starts cycle_ms
  //   after this one began, or when its all-reduces end if that is later. The thread's clock runs
  //   across steps, so the prediction is the steady state: the mean over 64 steps after 16.
  enum class Launch { Buckets, PerLayer, Cycles };
  Launch launch = Launch::Buckets;
  double cycle_ms = 5;            // Cycles only: Horovod's HOROVOD_CYCLE_TIME (5 ms until v0.21)
  bool bf16 = false;              // half the bytes on the wire
  // ZeRO-1 as `lockstep train --zero 1` runs it (docs/cost-model.md,
  // "ZeRO-1, trained"): each bucket is reduce-scattered on the ring in
  // backward (half the ring all-reduce's rounds and bytes, all of its
  // reduction), the optimizer updates 1/N of the parameters, and the weights
  // are all-gathered after it (the other half, exposed). Buckets only, not bf16.
  bool zero1 = false;
  // With zero1: the optimizer's passes over memory per parameter that the
  // profile's optimizer time stands for (plan.cpp's optimizer_passes). The
  // sharded step makes them over 1/N of the parameters, plus one more over
  // the other (N-1)/N: it still zeroes every gradient. 0: only the 1/N.
  double optimizer_passes = 0;
  double reduce_bytes_per_s = 0;  // gamma; 0 = free
  int host_cores = 0;             // the replicas share this many cores; 0 = a device each
  double host_latency_s = 0;      // software cost per message hand-off, per round
  // Stragglers: coefficient of variation of one replica's compute in one micro-step at the
  // profile's micro-batch; a step of K micro-steps of r times that batch varies by c / sqrt(K r).
  double compute_cv = 0;
};

// E[max of n independent standard normals]: 0 for n = 1, 1/sqrt(pi) for 2,
// 3/(2 sqrt(pi)) for 3; about sqrt(2 ln n) for large n. Throws
// InvalidArgument for n < 1.
double expected_max_normal(int n);

// How many times slower one replica computes when `replicas` share
// `host_cores` cores: max(1, replicas / host_cores); 1 when host_cores is 0.
double core_sharing(int replicas, int host_cores);

struct BucketTime {
  double bytes = 0;                               // on the wire
  double ready_ms = 0, start_ms = 0, end_ms = 0;  // since the step began
};

struct StepPrediction {
  double forward_ms = 0, backward_ms = 0, optimizer_ms = 0;  // per step (all micro-steps)
  double compute_ms = 0;                                     // their sum
  double sharing = 1;                                         // core_sharing(): compute is this much slower
  double straggler_ms = 0;                                   // forward + backward added by waiting for the slowest
  double comm_ms = 0;                                        // sum of the buckets' all-reduces
  double alpha_ms = 0, beta_ms = 0, gamma_ms = 0;            // comm_ms split by term
  double exposed_comm_ms = 0;                                // past the end of backward
  double gather_ms = 0;                                      // zero1: the weights' all-gather (in comm and exposed)
  double negotiation_ms = 0;                                 // Cycles: all agreements of a step, hidden or not
  double step_ms = 0;                                        // compute + exposed
  double gradient_bytes = 0;                                 // fp32, per replica
  double bytes_sent = 0;                                     // per replica per step
  Algorithm algorithm = Algorithm::Ring;                     // resolved, of the largest bucket
  std::vector<BucketTime> buckets;                           // launch order
};

// Throws InvalidArgument for replicas < 1, micro_batch < 1, accumulate < 1,
// negative host_cores, negative bucket sizes, a compute_cv that is not
// zero or positive and finite, a cycle_ms that is not positive
// and finite with Cycles, or a profile without parameters.
StepPrediction predict_step(const Profile& profile, const StepOptions& options);

}  // namespace lockstep::cost
