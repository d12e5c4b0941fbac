// `lockstep bench overlap`: does bucketing hide the all-reduce behind backward?
//
// On a modelled link (default 10 Gbit/s, 50 us per message) it trains N x B
// with the default buckets and with --bucket-mb 0 (one all-reduce after
// backward), `repeats` times each, interleaved, and reports the medians of
// the per-step step, compute, communication and exposed-communication times.
// Then it runs micro-batches 16..128, once each, and reports the gradient
// bytes sent per step (measured at the communicator) against the compute
// time: bytes stay, compute grows. Models: the MLP given by --hidden
// (default: 1024,1024,1024 and the default 512,512).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "checks.h"
#include "commands.h"
#include "host_memory.h"
#include "lockstep/train/trainer.h"
#include "median.h"

namespace lockstep::cli {
namespace {

struct OverlapFlags {
  std::string data_dir = data::default_data_dir().string();
  std::vector<std::string> hidden = {"1024,1024,1024", "512,512"};
  int replicas = 8;
  std::int64_t micro_batch = 32;
  std::int64_t steps = 40;
  int repeats = 3;
  std::string link_bandwidth = "10Gbit", link_latency = "50us";
  double bucket_mb = 25, first_bucket_mb = 1;
  bool json = false;
};

struct Arm {
  std::string name;
  double bucket_mb;
  std::int64_t micro_batch;
  std::vector<train::StepTimes> runs;
  std::uint64_t bytes_per_step = 0;
  std::size_t buckets = 0;
  train::StepTimes median_times() const {
    auto m = [&](double train::StepTimes::*f) {
      std::vector<double> v;
      for (const auto& r : runs) v.push_back(r.*f);
      return median(v);
    };
    train::StepTimes t;
    t.step_ms = m(&train::StepTimes::step_ms);
    t.compute_ms = m(&train::StepTimes::compute_ms);
    t.comm_ms = m(&train::StepTimes::comm_ms);
    t.exposed_comm_ms = m(&train::StepTimes::exposed_comm_ms);
    t.overlap_fraction = m(&train::StepTimes::overlap_fraction);
    t.comm_wait_ms = m(&train::StepTimes::comm_wait_ms);
    return t;
  }
};

std::vector<Arm> arms_of(const OverlapFlags& f) {
  std::vector<Arm> arms = {{"default buckets", f.bucket_mb, f.micro_batch, {}},
                           {"--bucket-mb 0", 0, f.micro_batch, {}}};
  for (std::int64_t mb : {16, 64, 128})
    if (mb != f.micro_batch) arms.push_back({"micro-batch " + std::to_string(mb), f.bucket_mb, mb, {}});
  return arms;
}

train::TrainConfig config_of(const OverlapFlags& f, const std::string& hidden, const Arm& arm,
                             const comm::LinkModel& link) {
  train::TrainConfig c;
  c.replicas = f.replicas;
  c.micro_batch = arm.micro_batch;
  c.hidden = parse_hidden(hidden);
  c.steps = f.steps;
  c.evaluate = false;
  c.log_every = 1 << 30;
  c.stop_poll_ms = 1e12;  // and no stop votes between: nothing but the step is timed
  c.bucket_mb = arm.bucket_mb;
  c.first_bucket_mb = f.first_bucket_mb;
  c.link = link;
  return c;
}

int run_bench_overlap(const OverlapFlags& f) {
  if (f.replicas < 2) {
    throw InvalidArgument("bench overlap needs at least 2 replicas: with one there is no all-reduce to overlap.");
  }
  // The bucketed arms with --bucket-mb 0 are one bucket after backward, the
  // arm they are compared with: the ratios compared the same run with itself.
  if (f.bucket_mb == 0) {
    throw InvalidArgument("--bucket-mb 0 makes the bucketed arms one bucket after backward, the same as the "
                          "arm they are compared with; give a bucket size above 0 (the default is 25).");
  }
  const auto data = load_data(f.data_dir);
  comm::LinkModel link{
      comm::parse_bandwidth(f.link_bandwidth),
      std::chrono::duration_cast<std::chrono::nanoseconds>(comm::parse_latency(f.link_latency))};
  // Every run's config is checked before the first starts: a sweep arm the
  // data cannot hold fails now, not minutes in; and so does one whose
  // replicas would not fit in memory (--hidden 30000,30000 is ~90 GB for 8
  // replicas, and the kernel's OOM killer ended such a run without a word).
  for (const auto& hidden : f.hidden) {
    for (const auto& arm : arms_of(f)) {
      try {
        const train::TrainConfig c = config_of(f, hidden, arm, link);
        train::total_steps(c, data);
        check_memory(c, data, c.replicas);
      } catch (const InvalidArgument& e) {
        if (arm.micro_batch == f.micro_batch) throw;
        throw InvalidArgument("bench overlap also runs " + arm.name + " (its sweep: 16, 64 and 128): " + e.what());
      }
    }
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& hidden : f.hidden) {
    std::vector<Arm> arms = arms_of(f);
    for (int rep = 0; rep < f.repeats; ++rep) {  // interleaved, so drift hits all arms alike
      for (auto& arm : arms) {
        if (rep > 0 && arm.name.rfind("micro-batch", 0) == 0) continue;  // bytes need one run
        const auto r = train::train(config_of(f, hidden, arm, link), data);
        arm.runs.push_back(r.times);
        arm.bytes_per_step = r.traffic[0].gradients / std::uint64_t(r.steps);
        arm.buckets = r.buckets.size();
      }
    }
    const auto on = arms[0].median_times(), off = arms[1].median_times();
    if (f.json) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& arm : arms) {
        const auto t = arm.median_times();
        rows.push_back({{"arm", arm.name},
                        {"micro_batch", arm.micro_batch},
                        {"runs", arm.runs.size()},
                        {"buckets", arm.buckets},
                        {"step_ms", t.step_ms},
                        {"compute_ms", t.compute_ms},
                        {"comm_ms", t.comm_ms},
                        {"exposed_comm_ms", t.exposed_comm_ms},
                        {"comm_wait_ms", t.comm_wait_ms},
                        {"overlap_fraction", t.overlap_fraction},
                        {"gradient_bytes_per_step", arm.bytes_per_step}});
      }
      out.push_back({{"hidden", hidden},
                     {"link", link.describe()},
                     {"step_ratio_default_vs_single_bucket", on.step_ms / off.step_ms},
                     {"exposed_over_comm_default", on.exposed_comm_ms / on.comm_ms},
                     {"arms", rows}});
      continue;
    }
    std::printf("MLP hidden %s, %d replicas, link %s; medians over %lld steps x %d runs (the micro-batch "
                "sweep: 1 run)\n",
                hidden.c_str(), f.replicas, link.describe().c_str(), (long long)f.steps, f.repeats);
    std::printf("  %-18s %6s %8s %9s %10s %8s %8s %10s %8s %12s\n", "arm", "micro", "buckets", "step ms",
                "compute ms", "comm ms", "wait ms", "exposed ms", "overlap", "bytes/step");
    for (const auto& arm : arms) {
      const auto t = arm.median_times();
      std::printf("  %-18s %6lld %8zu %9.2f %10.2f %8.2f %8.2f %10.2f %7.0f%% %12llu\n", arm.name.c_str(),
                  (long long)arm.micro_batch, arm.buckets, t.step_ms, t.compute_ms, t.comm_ms, t.comm_wait_ms,
                  t.exposed_comm_ms, 100 * t.overlap_fraction, (unsigned long long)arm.bytes_per_step);
    }
    std::printf("  (wait: the part of comm spent waiting for the last replica to start each all-reduce)\n");
    if (arms[0].buckets == 1) {  // the model's gradients fit in the first bucket
      std::printf("  note: the default buckets are one bucket for this model (its gradients fit in "
                  "--first-bucket-mb),\n        so the two arms ran the same way and their ratio is noise\n");
    }
    std::printf(
        "  step time, default buckets / one bucket: %.3f;  exposed / comm with default buckets: %.3f\n\n",
        on.step_ms / off.step_ms, on.exposed_comm_ms / on.comm_ms);
  }
  if (f.json) std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace

Action add_bench_overlap_command(CLI::App& bench) {
  auto flags = std::make_shared<OverlapFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "overlap", "Bucketed all-reduce overlapped with backward on a modelled link, against one bucket");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--data", flags->data_dir, "Directory of an IDX data set")
      ->check(not_empty());
  cmd->add_option("--hidden", flags->hidden, "MLP hidden widths, one model per value (default: two models)")
      ->default_str("1024,1024,1024 512,512");
  cmd->add_option("--replicas", flags->replicas, "Replicas")->transform(whole_number_in(1, 1024));
  cmd->add_option("--micro-batch", flags->micro_batch, "Micro-batch of the bucket comparison")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_option("--steps", flags->steps, "Steps per run")
      ->transform(whole_number_in(std::int64_t{2}, std::int64_t{1} << 20));
  cmd->add_option("--repeats", flags->repeats,
                  "Runs of each arm of the bucket comparison (the micro-batch sweep runs once); the median "
                  "is reported")
      ->transform(whole_number_in(1, 100));
  cmd->add_option("--link-bandwidth", flags->link_bandwidth, "Modelled link bandwidth")
      ->check(not_empty());
  cmd->add_option("--link-latency", flags->link_latency, "Modelled per-message latency")
      ->check(not_empty());
  cmd->add_option("--bucket-mb", flags->bucket_mb, "Bucket size of the bucketed arms (MiB), above 0")
      ->check(number_in(0.0, 1e6));
  cmd->add_option("--first-bucket-mb", flags->first_bucket_mb, "First bucket size (MiB)")
      ->check(number_in(0.0, 1e6));
  cmd->add_flag("--json", flags->json, "Print JSON instead of a table");
  return [flags] { return run_bench_overlap(*flags); };
}

}  // namespace lockstep::cli
