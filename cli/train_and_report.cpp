#include "train_and_report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bucket_choice.h"
#include "commands.h"
#include "lockstep/cost/profile.h"
#include "lockstep/error.h"
#include "lockstep/nn/weights_file.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/report.h"
#include "measured_profile.h"
#include "output_files.h"
#include "peak_flops.h"
#include "progress_printer.h"
#include "restarts.h"
#include "stop_on_signal.h"
#include "train_as_rank.h"
#include "train_flag_checks.h"

namespace lockstep::cli {

int train_and_report(TrainFlags& f, const data::ImageClassificationData& data, comm::Communicator* group) {
  auto& c = f.config;
  const bool rank0 = group == nullptr || group->rank() == 0;  // prints and writes files
  // Over processes, every rank on this host needs its copy.
  check_memory(c, data, group == nullptr ? c.replicas : ranks_on_this_host(*group),
               rank0 && !f.checkpoint_file.empty());
  const HostCores host = host_cores();
  c.cores = host.process;  // the replicas' BLAS threads
  one_bucket_if_cores_are_shared(f, group, host);
  const std::int64_t steps =
      train::total_steps(c, data);  // the trainer's own checks of the config, before seconds of measuring
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
  const auto host_peak = [&] {
    return f.peak_gflops > 0 ? f.peak_gflops * 1e9 : measure_peak_sgemm_flops(host);
  };
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
      std::fprintf(
          stderr,
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
    warn(
        "--check-every 0 turns the divergence detector off: the injected bit flip will go unnoticed and the "
        "replicas end with different weights (what the detector is there to catch).");
  }
  // A fault at a step the resumed run does not run never happens: say so,
  // rather than show a clean run as if the guards had seen nothing (not
  // refused: --auto-resume runs one command again, and the fault was in the
  // run before).
  for (const auto& x : c.inject) {
    if (x.kind != train::Fault::Kind::SameSeed && x.step < c.start_step) {
      warn("--inject names step " + std::to_string(x.step) +
           ", before the steps this run goes on with (from " + std::to_string(c.start_step) + ", " +
           resume_flag(f) + "): that fault will not happen in this run.");
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
      warn(
          "a rank was lost after the last step, while the outputs were gathered; the weights it trained to "
          "the "
          "end (compared across the ranks after the last step) are saved to " +
          f.save_file + ", and the report, trace and profile are not written.");
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
           " GFLOP/s: this host's sgemm peak times world size / LOCAL_WORLD_SIZE); set LOCAL_WORLD_SIZE to "
           "the "
           "ranks per host, or take MFU as approximate.");
    } else {
      warn(std::string("MFU over 1: training ran faster than the sgemm peak this run measured (") + gflops +
           " GFLOP/s, the best of its measurements); the machine's speed varied during the run, so take MFU "
           "as "
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
    warn("--report not written: " + f.report_file +
         " is there already, from the run that trained, and this run "
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
  if (!f.profile_file.empty() &&
      result.steps < 2) {  // stopped early: --profile's check saw the planned steps
    warn("--profile not written: the run stopped after " + std::to_string(result.steps) +
         " step, and a profile times every step but the first.");
  } else if (!f.profile_file.empty()) {
    write_file_atomically(f.profile_file, cost::profile_to_json(measured_profile(c, result, data)),
                          "the profile");
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

}  // namespace lockstep::cli
