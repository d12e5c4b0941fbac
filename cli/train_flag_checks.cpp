#include "train_flag_checks.h"

#include <string>

#include "lockstep/comm/process_group.h"
#include "lockstep/error.h"
#include "process_group_flags.h"

namespace lockstep::cli {

std::vector<NamedFile> output_files(const TrainFlags& f) {
  return {{"--save", f.save_file},        {"--report", f.report_file},   {"--trace", f.trace_file},
          {"--timeline-svg", f.svg_file}, {"--profile", f.profile_file}, {"--checkpoint", f.checkpoint_file}};
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
    throw InvalidArgument(
        "--momentum applies to --optimizer sgd only (adamw has its own moments); leave it "
        "out with --optimizer " +
        c.optimizer + ".");
  if (f.steps_option->count() > 0 && f.epochs_option->count() > 0 && c.steps > 0)
    throw InvalidArgument("--steps and --epochs both set the length of the run; give one of them.");
  // Flags that would be ignored: refused, so that nobody believes they took effect.
  const auto given = [&](const char* flag) { return f.cmd->get_option(flag)->count() > 0; };
  for (const char* flag : {"--save", "--report", "--trace", "--timeline-svg", "--profile", "--init",
                           "--checkpoint", "--resume"}) {
    if (given(flag) && f.cmd->get_option(flag)->as<std::string>().empty())
      throw InvalidArgument(std::string(flag) + " needs a file name.");
  }
  // An empty value would read as the flag not given: no link, the default data.
  for (const char* flag : {"--data", "--link-bandwidth", "--link-latency"}) {
    if (given(flag) && f.cmd->get_option(flag)->as<std::string>().empty())
      throw InvalidArgument(std::string(flag) + " needs a value; leave the flag out for its default.");
  }
  if (!c.deterministic && given("--atom"))
    throw InvalidArgument(
        "--atom sets --deterministic's unit of summation; add --deterministic or leave it out.");
  if (c.deterministic) {
    for (const char* flag : {"--ragged", "--bucket-mb", "--first-bucket-mb", "--overlap"}) {
      if (given(flag)) {
        throw InvalidArgument(
            std::string("--deterministic sums the whole gradient in one fixed tree after backward "
                        "and drops an epoch's partial last batch, so ") +
            flag + " has no effect; leave it out.");
      }
    }
  }
  if (c.bucket_mb == 0 && given("--first-bucket-mb"))
    throw InvalidArgument(
        "--bucket-mb 0 puts every gradient in one bucket, so --first-bucket-mb has no effect; "
        "leave it out.");
  if (c.check_every == 0 && given("--on-divergence"))
    throw InvalidArgument(
        "--on-divergence acts when the divergence check finds replicas apart, and --check-every 0 "
        "turns the check off; give --check-every N or leave --on-divergence out.");
  if (c.zero == 1 && !f.profile_file.empty())
    throw InvalidArgument(
        "--profile records the replicated step for lockstep plan, whose --zero 1 shards it itself; "
        "run --profile without --zero 1.");
  if (c.checkpoint_every > 0 && f.checkpoint_file.empty())
    throw InvalidArgument("--checkpoint-every says how often to write --checkpoint FILE; give that too.");
  if (!f.resume_file.empty() && !f.init_file.empty()) {
    throw InvalidArgument(
        "--resume and --init both set the starting weights (--resume takes the checkpoint's); "
        "give one of them.");
  }
  if (f.auto_resume && f.checkpoint_file.empty())
    throw InvalidArgument(
        "--auto-resume goes on from the file --checkpoint writes; give --checkpoint FILE too.");
  if (f.auto_resume && !f.resume_file.empty()) {
    throw InvalidArgument(
        "--resume names the checkpoint to go on from, and --auto-resume takes --checkpoint's when "
        "it is there; give one of them.");
  }
  if (given("--seed") && !f.init_file.empty() && !c.shuffle && c.model == "mlp") {
    throw InvalidArgument(
        "--seed draws the initial weights, the data order and dropout, and with --init, "
        "--shuffle off and --model mlp (no dropout) it draws none of them; leave it out.");
  }
  if (c.model == "mlp" && given("--bn-stats"))
    throw InvalidArgument(
        "--bn-stats chooses how batch-norm statistics are kept, and --model mlp has none; leave "
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
                          std::to_string(f.config.start_step) +
                          ", where this run goes on from its checkpoint.");
  }
}

}  // namespace lockstep::cli
