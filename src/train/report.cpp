#include "lockstep/train/report.h"

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <thread>
#include <nlohmann/json.hpp>

#include "lockstep/version.h"

namespace lockstep::train {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB"};
  int u = 0;
  while (b >= 1000 && u < 3) b /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

// The steps this process ran (a resumed run's count from the start).
std::int64_t steps_here(const TrainResult& r) { return r.steps - r.resumed_from_step; }

std::uint64_t gradient_bytes_per_step(const TrainResult& r) {
  return steps_here(r) > 0 && !r.traffic.empty() ? r.traffic[0].gradients / steps_here(r) : 0;
}

// What all replicas sent together, by kind.
TrafficBytes total_sent(const TrainResult& r) {
  TrafficBytes sum;
  for (const TrafficBytes& t : r.traffic) {
    sum.init_broadcast += t.init_broadcast;
    sum.setup += t.setup;
    sum.gradients += t.gradients;
    sum.control += t.control;
    sum.checks += t.checks;
    sum.repair += t.repair;
    sum.buffers += t.buffers;
    sum.weights += t.weights;
    sum.resume += t.resume;
    sum.checkpoint += t.checkpoint;
    sum.clip += t.clip;
    sum.unaccounted += t.unaccounted;
  }
  return sum;
}

// "1 replica", "8 replicas".
std::string plural(std::int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

// "2 epochs", "1.50 epochs", "1 epoch": whole numbers as such, else two
// decimals; the plural follows what is printed (0.9995 is "1.00 epoch").
std::string epochs_text(double epochs) {
  char number[32];
  std::snprintf(number, sizeof number, epochs == std::floor(epochs) ? "%.0f" : "%.2f", epochs);
  const std::string n = number;
  return n + (n == "1" || n == "1.00" ? " epoch" : " epochs");
}

}  // namespace

std::string summary_text(const TrainConfig& c, const TrainResult& r) {
  char line[512];
  std::string s;
  const std::string steps = plural(r.steps, "step") + " (" + epochs_text(r.epochs) + ")";
  if (r.accumulate > 1) {
    std::snprintf(line, sizeof line,
                  "lockstep: %s x %lld x %lld accumulated micro-steps = effective batch %lld, %s\n",
                  plural(r.replicas, "replica").c_str(), (long long)r.micro_batch, (long long)r.accumulate,
                  (long long)r.global_batch, steps.c_str());
  } else {
    std::snprintf(line, sizeof line, "lockstep: %s x %lld = global batch %lld, %s\n",
                  plural(r.replicas, "replica").c_str(), (long long)r.micro_batch, (long long)r.global_batch,
                  steps.c_str());
  }
  s += line;
  s += "  model        " + r.model_description + " (" + std::to_string(r.param_count) + " parameters)\n";
  s += "  replicated   per replica: weights " + human_bytes(double(r.weight_bytes)) + ", gradients " +
       human_bytes(double(r.grad_bytes)) + ", optimizer state " + human_bytes(double(r.optimizer_state_bytes)) +
       (r.zero == 1 ? " (--zero 1: at most this much of the " + human_bytes(double(r.optimizer_state_bytes_whole)) +
                          " each replica would hold; not replicated but sharded, " + r.optimizer_description + ")\n"
                    : " (" + r.optimizer_description + ")\n");
  if (r.replicas == 1) {  // nothing to split, nothing to communicate
    std::snprintf(line, sizeof line, "  split        each step's %lld samples all go to the one replica; ",
                  (long long)r.global_batch);
  } else {
    std::snprintf(line, sizeof line, "  split        each step's %lld samples are cut into %lld disjoint shards of %lld; ",
                  (long long)r.global_batch, (long long)r.replicas, (long long)(r.micro_batch * r.accumulate));
  }
  s += line;
  if (r.last_step_samples > 0) {  // the epoch's last, partial step
    std::string shards = std::to_string(r.last_step_min_shard);
    if (r.last_step_max_shard != r.last_step_min_shard) shards += " to " + std::to_string(r.last_step_max_shard);
    s += "an epoch's last step has " + std::to_string(r.last_step_samples) + ", in shards of " + shards +
         (c.ragged == Ragged::Pad ? " (--ragged pad: padded and masked); "
                                  : " (--ragged weighted: each gradient weighted by its count); ");
  }
  if (r.samples_dropped_per_epoch > 0) {  // the card's second remedy: never formed
    s += "an epoch's last " + std::to_string(r.samples_dropped_per_epoch) + " samples are dropped (" +
         (c.deterministic ? "--deterministic" : "--ragged drop") + "); ";
  }
  std::snprintf(line, sizeof line, "%lld samples read in all, each by one replica\n", (long long)r.samples_seen);
  s += line;
  // One all-reduce per bucket per step (one in all with --deterministic).
  const std::string calls = c.deterministic       ? "one all-reduce"
                            : r.zero == 1 ? (r.buckets.size() == 1 ? std::string("one reduce-scatter, one bucket")
                                                                   : std::to_string(r.buckets.size()) +
                                                                         " reduce-scatters, one per bucket")
                            : r.buckets.size() == 1 ? "one all-reduce, one bucket"
                                                    : std::to_string(r.buckets.size()) + " all-reduces, one per bucket";
  // Per replica when they all send alike (the ring, shared memory: chunk
  // rounding aside); the naive and halving-doubling all-reduces do not, so
  // then rank 0's is not called everyone's.
  double lo = 0, hi = 0, sum = 0;
  for (std::size_t i = 0; i < r.traffic.size() && steps_here(r) > 0; ++i) {
    const double b = double(r.traffic[i].gradients) / double(steps_here(r));
    lo = i == 0 ? b : std::min(lo, b), hi = i == 0 ? b : std::max(hi, b), sum += b;
  }
  // With --compress bf16, P is the gradients' bf16 bytes, half the float32 ones above.
  std::string formula = " (2P(N-1)/N = " + human_bytes(double(r.allreduce_bytes_per_step_formula)) +
                        (c.compression == ddp::Compression::Bf16
                             ? " for P = " + human_bytes(double(r.grad_bytes) / 2) + " of gradients in bf16"
                             : std::string()) +
                        ", independent of the micro-batch)\n";
  if (r.zero == 1 && steps_here(r) > 0 && !r.traffic.empty()) {  // the other half: the weights' all-gather
    formula = ", then " + human_bytes(double(r.traffic[0].weights) / double(steps_here(r))) +
              " of weights all-gathered after the optimizer step (" +
              (c.deterministic ? "3P(N-1)/N in all under --deterministic, which all-reduces the gradients; "
                               : "together the bytes of one all-reduce, ") +
              "2P(N-1)/N = " + human_bytes(double(r.allreduce_bytes_per_step_formula)) +
              ", independent of the micro-batch)\n";
  }
  if (r.replicas == 1) {
    s += "  communicated nothing: one replica has no other to all-reduce with (2P(N-1)/N = 0 B)\n";
  } else if (r.traffic.size() > 1 && hi > lo * 1.01 + 64) {
    s += "  communicated per step: rank 0 " + human_bytes(double(gradient_bytes_per_step(r))) +
         " of gradients, the replicas " + human_bytes(lo) + " to " + human_bytes(hi) + " (mean " +
         human_bytes(sum / double(r.traffic.size())) + "), in " + calls + formula;
  } else {
    s += std::string("  communicated per step per replica") +
         (r.traffic.size() == 1 && r.replicas > 1 ? " (rank 0's)" : "") + ": " +
         (steps_here(r) > 0 ? human_bytes(double(gradient_bytes_per_step(r))) + " of gradients in "
                            : std::string("no step in this run; a step's gradients go in ")) +
         calls + formula;
  }
  const TrafficBytes& t0 = r.traffic.empty() ? TrafficBytes{} : r.traffic[0];
  if (r.replicas > 1 && t0.gradients > 0) {
    if (t0.gradient_messages == 0) {  // in-process, also as the threads backend's --algorithm native
      s += r.zero == 1 && !c.deterministic
                       ? "               counted by the shared-memory reduce-scatter and all-gather, which send no "
                         "messages: what the other replicas read of this one's gradients plus what it writes into "
                         "their weights"
                       : "               counted by the shared-memory all-reduce, which sends no messages: what the "
                         "other replicas read of this one's gradients plus what it writes into theirs";
      s += c.deterministic ? "\n" : " (--algorithm ring counts messages)\n";
    } else if (c.algorithm == comm::Algorithm::Native) {  // Gloo's or MPI's own: only fingerprints counted
      s += "               booked as a ring would send them: the transport's own all-reduce (--algorithm native) "
           "does not report its traffic\n";
    } else {
      std::snprintf(line, sizeof line,
                    "               counted message by message: %.4g messages per step (the %s' rounds "
                    "and segments; over processes, each one's fingerprint check too)\n",
                    double(t0.gradient_messages) / double(steps_here(r)),
                    r.zero == 1 && !c.deterministic ? "reduce-scatters" : "all-reduces");
      s += line;
    }
  }
  if (c.deterministic) {
    std::snprintf(line, sizeof line,
                  "  deterministic atoms of %lld samples, each replica's summed in a tree, the replicas' by the "
                  "tree all-reduce, divided once: bit-exact for any power-of-two replica count\n",
                  (long long)c.atom);
    s += line;
  } else {
  char sizes[96];
  if (c.one_bucket_on_shared_cores) {
    std::snprintf(sizes, sizeof sizes, "every gradient in one: the replicas share the cores, nothing would overlap");
  } else if (c.bucket_mb == 0) {
    std::snprintf(sizes, sizeof sizes, "%severy gradient in one",
                  c.buckets_from_checkpoint ? "the checkpoint's: " : "--bucket-mb 0: ");
  } else {
    std::snprintf(sizes, sizeof sizes, "%sfirst %.3g MiB, then %.3g MiB",
                  c.buckets_from_checkpoint ? "the checkpoint's: " : "", c.first_bucket_mb, c.bucket_mb);
  }
  // One bucket is ready only when backward has ended, even on a thread of its own.
  const char* when = r.overlapped && r.buckets.size() > 1 ? "during backward"
                     : r.overlapped                       ? "on the communication thread, after backward"
                     : c.bucket_mb == 0                   ? "after backward"
                     : c.overlap == Overlap::Off  ? "after backward (--overlap off)"
                                                  : "after backward (--overlap auto is off for in-process "
                                                    "replicas, whose all-reduce runs on the cores that compute; "
                                                    "--overlap on forces a thread)";
  std::snprintf(
      line, sizeof line, "  buckets      %zu (%s), %s %s%s%s%s\n", r.buckets.size(), sizes,
      r.zero == 1 ? "reduce-scattered" : "all-reduced", when,
      c.compression == ddp::Compression::Bf16 ? ", bf16 on the wire" : "",
      c.link.enabled() ? ", modelled link " : "", c.link.enabled() ? c.link.describe().c_str() : "");
  s += line;
  }
  std::snprintf(line, sizeof line,
                "  step time    %.2f ms (median): compute %.2f, communication %.2f, exposed (waited for) %.2f, "
                "overlap %.0f%% (each its own median)\n",
                r.times.step_ms, r.times.compute_ms, r.times.comm_ms, r.times.exposed_comm_ms,
                100 * r.times.overlap_fraction);
  // Note [A job that had ended]: nothing was timed.
  s += steps_here(r) > 0 ? line : "  step time    none: this run went on from the job's last step, and ran no step\n";
  if (!std::isnan(r.times.comm_wait_ms) && r.replicas > 1) {  // Note [Waiting for the last replica]
    std::snprintf(line, sizeof line,
                  "               communication: %.2f ms waiting for the last replica to join the %s, "
                  "%.2f ms once all had joined (each its own median, so the two need not add up)",
                  r.times.comm_wait_ms, r.zero == 1 && !c.deterministic ? "reduce-scatter" : "all-reduce",
                  r.times.comm_joined_ms);
    s += line;
    // More replicas than cores: the OS runs the others' compute inside both
    // parts, which a learner would read as a communication-bound step.
    const int cores = c.cores > 0 ? c.cores : static_cast<int>(std::thread::hardware_concurrency());
    if (cores > 0 && r.replicas > cores) {
      std::snprintf(line, sizeof line,
                    "; %lld replicas share %d cores, so both hold the time the OS ran the other replicas' "
                    "compute (lockstep bench allreduce times the all-reduce alone)",
                    (long long)r.replicas, cores);
      s += line;
    }
    s += "\n";
  }
  // Measured: all bytes the replicas sent in the initial broadcast, spread
  // over the N-1 replicas that received them.
  const TrafficBytes all = total_sent(r);
  const double received = r.replicas > 1 ? double(all.init_broadcast) / double(r.replicas - 1) : 0.0;
  // What crossed after it is the run's total over all replicas, unlike the
  // per-step, per-replica figures above; said so, since under --zero 1 it
  // reads beside the all-gather's bytes of one step of one replica.
  const std::uint64_t after = all.repair + all.unaccounted + all.weights;
  // A --resume run also sends the checkpoint's optimizer state (and each
  // replica's own parts) at the start, booked apart from the weights.
  const std::string resumed =
      all.resume > 0 && r.replicas > 1
          ? ", and " + human_bytes(double(all.resume) / double(r.replicas - 1)) +
                " more of the checkpoint's state for --resume"
          : "";
  s += (r.replicas == 1 ? "               weights: one replica, no other to broadcast them to, "
                         : "               weights: broadcast once at start (each other replica received " +
                               human_bytes(received) + resumed + "), ") +
       human_bytes(double(after)) + " after" + (after > 0 ? " by all replicas over the run" : "") +
       (all.weights > 0 ? " (all-gathered every step: --zero 1 shards the update, not the weights)" : "") +
       (all.repair > 0 ? std::string(r.zero == 1 ? " (re-broadcast by "
                                                  : " (re-broadcast with the optimizer state by ") +
                              std::to_string(r.repairs) +
                              " --on-divergence repair" + (r.repairs == 1 ? "" : "s") + ")"
                        : "") +
       "; activations: " + human_bytes(double(all.unaccounted)) + "\n";
  if (!r.buffer_layout.tensors().empty()) {
    s += "  buffers      " + std::to_string(r.buffer_layout.numel()) + " floats per replica (";
    for (std::size_t i = 0; i < r.buffer_layout.tensors().size(); ++i) {
      s += (i ? ", " : "") + r.buffer_layout.tensors()[i].name;
    }
    if (c.deterministic) {
      s += "): each atom's update summed in the atom tree and applied once; identical on every replica\n";
    } else if (c.bn_stats == BnStats::Sync) {
      s += "): --bn-stats sync, the replicas' updates averaged every step, each weighted by its samples; identical on every replica";
      // Not part of the gradients' all-reduce: one of their own a step, which
      // the communicated line above does not count.
      if (steps_here(r) > 0 && !r.traffic.empty() && r.traffic[0].buffers > 0)
        s += "; " + human_bytes(double(r.traffic[0].buffers) / double(steps_here(r))) +
             " a step per replica in an all-reduce of their own, beside the gradients'";
      s += "\n";
    } else {
      s += "): --bn-stats local, each replica updates its own from its own micro-batches; never averaged";
      if (total_sent(r).checkpoint > 0) s += " (gathered to rank 0 for --checkpoint)";
      if (r.divergence_checks > 0)
        s += " (they differed at " + std::to_string(r.buffer_checks_differing) + " of " +
             plural(r.divergence_checks, "check") + ", as expected)";
      s += "\n";
    }
  }
  // The card's other non-parameter state: dropout masks (Note [Keyed dropout] in src/nn/dropout.cpp).
  if (r.model_description.find("Dropout(") != std::string::npos) {
    s += "  dropout      masks drawn per sample from (seed, step, the sample's index): each replica's differ, as its "
         "samples do, and are never communicated; a sample gets the same mask whichever replica runs it\n";
  }
  if (r.replicas == 1) {
    // Nothing was broadcast (the weights line says so), and every comparison
    // would be of the one replica with itself.
    s += "  guards       one replica: no other to agree with in the start-up handshake, to verify the weights "
         "against or to compare them with" +
         std::string(c.check_every > 0 ? " (" + plural(r.divergence_checks, "divergence check") + ", met trivially)"
                                       : " (divergence detector off)");
  } else if (steps_here(r) == 0) {  // Note [A job that had ended]: nothing to compare or audit
    s += "  guards       start-up handshake of " + std::to_string(r.handshake_fields) +
         " fields agreed, weights verified after the broadcast";
  } else {
    s += "  guards       start-up handshake of " + std::to_string(r.handshake_fields) +
         " fields agreed, weights verified after the broadcast; ";
    if (c.check_every > 0) {
      // Every check_every steps and after the last: the run's checks over its steps.
      const double steps_time = double(steps_here(r)) * r.times.step_ms;
      std::snprintf(line, sizeof line, "%.2f ms each, %.1f%% of the step time", r.times.check_ms,
                    steps_time > 0 ? 100 * r.times.check_ms * double(r.divergence_checks) / steps_time : 0.0);
      const bool buffers_compared =
          !r.buffer_layout.tensors().empty() && (c.bn_stats == BnStats::Sync || c.deterministic);
      const char* state = r.zero == 1 ? " (the optimizer state is sharded: each replica's is its own)" : "";
      s += std::string(r.zero == 1 ? (buffers_compared ? "weights and buffers" : "weights")
                       : buffers_compared ? "weights, optimizer state and buffers"
                                          : "weights and optimizer state") + state +
           " compared every " + (c.check_every > 1 ? plural(c.check_every, "step") : "step") +
           " and after the last (" + plural(r.divergence_checks, "check") + ", " + line + ", " +
           plural(r.repairs, "repair") + ")";
    } else {
      s += "divergence detector off";
    }
  }
  if (steps_here(r) == 0) {
    s += "; this run made no step, so it compared and audited nothing (the run that trained the checkpoint's steps "
         "checked them)\n";
  } else {
    s += "; " + plural(std::int64_t(r.skipped.size()), "step") + " skipped for non-finite gradients; each sample an " +
         "epoch uses read exactly once (" + plural(r.accounting_checks, "accounting check") + ")\n";
  }
  if (c.clip_grad_norm > 0) {  // Note [Clipping the averaged gradient]
    std::vector<double> norms;  // of the steps applied (a skipped step's is NaN)
    for (double n : r.grad_norms)
      if (!std::isnan(n)) norms.push_back(n);
    std::sort(norms.begin(), norms.end());
    const std::size_t k = norms.size();
    if (k == 0) {
      std::snprintf(line, sizeof line, "  clipping     to norm %.4g: no step applied a gradient, so none was clipped\n",
                    double(c.clip_grad_norm));
      s += line;
    } else {
      std::snprintf(line, sizeof line,
                    "  clipping     the averaged gradient's norm clipped to %.4g at %lld of %zu steps applied (norm "
                    "median %.4g, largest %.4g); every replica computes it alike",
                    double(c.clip_grad_norm), (long long)r.clipped_steps, k,
                    k % 2 == 1 ? norms[k / 2] : (norms[k / 2 - 1] + norms[k / 2]) / 2, norms.back());
      s += line;
      // Per replica, a step's and the run's (the figure alone read as a step's).
      const double clip_per_replica = double(total_sent(r).clip) / double(r.replicas);
      s += total_sent(r).clip > 0 ? ", from the parts the replicas exchange (--zero 1: " +
                                        human_bytes(clip_per_replica / double(std::max<std::int64_t>(1, steps_here(r)))) +
                                        " a step per replica, " + human_bytes(clip_per_replica) + " over the run)\n"
                                  : ", with no communication\n";
    }
  }
  std::snprintf(line, sizeof line, "  result       final loss %.4f", r.final_loss);
  s += std::isnan(r.final_loss) && steps_here(r) == 0 ? "  result       final loss not known (no step ran)" : line;
  // A resumed run's loss window starts at its first step: the unbroken run's
  // held steps before the resume, which a checkpoint does not keep. Not
  // where the resume fell on a progress point: the two windows are the same.
  if (r.final_loss_window_cut) {  // only for a resumed run that ran steps
    std::snprintf(line, sizeof line, " (over steps %lld to %lld: a resumed run's loss window starts at its first step)",
                  (long long)r.final_loss_first_step, (long long)r.final_loss_last_step);
    s += line;
  }
  if (r.test_accuracy) {
    std::snprintf(line, sizeof line, ", test accuracy %.4f", *r.test_accuracy);
    s += line;
  }
  std::snprintf(line, sizeof line, ", %.0f samples/s", r.samples_per_s);
  s += line;
  if (r.mfu > 0) {
    std::snprintf(line, sizeof line, ", MFU %.2f", r.mfu);
    s += line;
    if (c.peak_flops_given) s += " (of the peak --peak-gflops gives)";
  }
  s += "\n";
  if (r.resumed_from_step > 0) {
    s += "  resumed      from a checkpoint after step " + std::to_string(r.resumed_from_step) +
         " (steps and epochs count from the start; samples/s" +
         (c.clip_grad_norm > 0 ? ", the timings and the clipping counts" : " and the timings") + " are this run's)\n";
  }
  if (r.stopped_early) {
    s += "  stopped      early, after step " + std::to_string(r.steps) + " of " + std::to_string(r.steps_planned) +
         " when asked to (SIGINT, SIGTERM, SIGHUP or SIGUSR1 to lockstep train, or a program's "
         "TrainHooks::stop_requested); " +
         "the result is that step's\n";
  }
  return s;
}

std::string report_json(const TrainConfig& c, const TrainResult& r) {
  nlohmann::json j;
  j["build"] = lockstep::build_id();  // over processes every rank's: connect compared them
  j["replicas"] = r.replicas;
  j["micro_batch"] = r.micro_batch;
  j["accumulate"] = r.accumulate;
  j["global_batch"] = r.global_batch;
  j["steps"] = r.steps;
  j["steps_planned"] = r.steps_planned;
  j["stopped_early"] = r.stopped_early;
  j["resumed_from_step"] = r.resumed_from_step;
  j["epochs"] = r.epochs_run;
  j["final_loss"] = r.final_loss;
  // null where no step ran, as final_loss is then.
  j["final_loss_steps"] = r.final_loss_first_step > 0
                              ? nlohmann::json{r.final_loss_first_step, r.final_loss_last_step}
                              : nlohmann::json();
  j["test_accuracy"] = r.test_accuracy ? nlohmann::json(*r.test_accuracy) : nlohmann::json();
  j["epoch_test_accuracy"] = r.epoch_test_accuracy;
  j["samples_per_s"] = r.samples_per_s;
  j["mfu"] = r.mfu;
  j["peak_flops"] = c.peak_flops;
  j["peak_flops_measured"] = c.peak_flops > 0 && !c.peak_flops_given;
  j["train_seconds"] = r.train_seconds;
  j["flops_per_sample"] = r.flops_per_sample;
  j["model"] = r.model_description;
  j["optimizer"] = r.optimizer_description;
  j["parameters"] = r.param_count;
  j["config"] = {{"lr", c.lr},
                 {"momentum", c.momentum},
                 {"weight_decay", c.weight_decay},
                 {"seed", c.seed},
                 {"shuffle", c.shuffle},
                 {"schedule", c.schedule == optim::Schedule::Cosine ? "cosine" : "constant"},
                 {"lr_warmup", c.lr_warmup},
                 {"clip_grad_norm", c.clip_grad_norm},
                 {"ragged", to_string(c.ragged)},
                 {"deterministic", c.deterministic},
                 {"atom", c.atom},
                 {"first_bucket_mb", c.first_bucket_mb},
                 {"bucket_mb", c.bucket_mb},
                 {"one_bucket_on_shared_cores", c.one_bucket_on_shared_cores},
                 {"algorithm", comm::to_string(c.algorithm)},
                 {"compress", c.compression == ddp::Compression::Bf16 ? "bf16" : "none"},
                 {"zero", r.zero},
                 {"overlap", r.overlapped},
                 {"link_bytes_per_second", c.link.bytes_per_second},
                 {"link_latency_us", double(c.link.latency.count()) / 1000.0}};
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& k : r.skipped) skipped.push_back({{"step", k.step}, {"ranks", k.ranks}});
  j["guards"] = {{"handshake_fields", r.handshake_fields},
                 {"check_every", c.check_every},
                 {"on_divergence", c.on_divergence == OnDivergence::Stop ? "stop" : "repair"},
                 {"divergence_checks", r.divergence_checks},
                 {"repairs", r.repairs},
                 {"accounting_checks", r.accounting_checks},
                 {"bn_stats", c.bn_stats == BnStats::Sync ? "sync" : "local"},
                 {"buffer_checks_differing", r.buffer_checks_differing},
                 {"max_skips", c.max_skips},
                 {"skipped_steps", skipped}};
  if (c.clip_grad_norm > 0) {
    j["clipping"] = {{"max_norm", c.clip_grad_norm}, {"clipped_steps", r.clipped_steps}, {"grad_norms", r.grad_norms}};
  } else {
    j["clipping"] = nullptr;
  }
  j["timing"] = {{"step_ms", r.times.step_ms},
                 {"compute_ms", r.times.compute_ms},
                 {"comm_ms", r.times.comm_ms},
                 {"exposed_comm_ms", r.times.exposed_comm_ms},
                 {"overlap_fraction", r.times.overlap_fraction},
                 {"comm_wait_ms", r.times.comm_wait_ms},
                 {"comm_joined_ms", r.times.comm_joined_ms},
                 {"check_ms", r.times.check_ms}};
  nlohmann::json buckets = nlohmann::json::array();
  // --deterministic all-reduces the atoms' total in one call, not in buckets.
  for (const auto& b : c.deterministic ? std::vector<ddp::Bucket>{} : r.buckets) {
    nlohmann::json names = nlohmann::json::array();
    for (auto t : b.tensors) names.push_back(r.layout.tensors()[t].name);
    buckets.push_back({{"bytes", b.bytes()}, {"offset", b.offset}, {"tensors", names}});
  }
  j["buckets"] = buckets;
  const auto& t0 = r.traffic.empty() ? TrafficBytes{} : r.traffic[0];
  const TrafficBytes all = total_sent(r);
  j["bytes"] = {{"weights_per_replica", r.weight_bytes},
                {"grads_per_replica", r.grad_bytes},
                {"optimizer_state_per_replica", r.optimizer_state_bytes},
                {"allreduce_per_step_per_replica", r.allreduce_bytes_per_step_formula},
                {"measured_gradient_bytes_sent_per_step_per_replica", gradient_bytes_per_step(r)},
                {"gradient_messages_per_step_per_replica",
                 steps_here(r) > 0 ? double(t0.gradient_messages) / double(steps_here(r)) : 0.0},
                {"weights_broadcast_at_init", t0.init_broadcast},
                {"weights_exchanged_after_init", all.repair + all.unaccounted + all.weights},
                {"weights_all_gathered_per_step_per_replica", steps_here(r) > 0 ? t0.weights / std::uint64_t(steps_here(r)) : 0},
                {"optimizer_state_unsharded", r.optimizer_state_bytes_whole},
                {"activations_communicated", all.unaccounted},
                {"control_bytes", t0.control}};
  nlohmann::json per = nlohmann::json::array();
  for (const auto& t : r.traffic) {
    per.push_back({{"init_broadcast", t.init_broadcast},
                   {"setup", t.setup},
                   {"gradients", t.gradients},
                   {"gradient_messages", t.gradient_messages},
                   {"control", t.control},
                   {"checks", t.checks},
                   {"repair", t.repair}, {"buffers", t.buffers}, {"weights", t.weights}, {"resume", t.resume},
                   {"checkpoint", t.checkpoint}, {"clip", t.clip}, {"unaccounted", t.unaccounted}});
  }
  j["bytes"]["per_replica_sent"] = per;
  return j.dump(2) + "\n";
}

}  // namespace lockstep::train
