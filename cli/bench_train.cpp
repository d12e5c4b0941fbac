// `lockstep bench train`: end-to-end training throughput and MFU.
//
// Runs the same global batch (256) as 8 x 32, 2 x 128 and 1 x 256 on the
// default model and data, each `repeats` times, and reports the median
// samples/s, MFU against the peak sgemm FLOP/s measured in the same run, and
// each configuration's throughput relative to the best one.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "lockstep/nn/gemm.h"
#include "lockstep/train/trainer.h"
#include "peak_flops.h"

namespace lockstep::cli {
namespace {

struct BenchFlags {
  std::string data_dir = data::default_data_dir().string();
  std::int64_t steps = 100;
  std::int64_t warmup = 10;
  int repeats = 3;
  bool json = false;
};

int run_bench_train(const BenchFlags& f) {
  const auto data = data::load_image_classification(f.data_dir);
  const double peak = measure_peak_sgemm_flops();
  struct Row {
    int replicas;
    std::int64_t micro_batch;
    std::vector<double> samples_per_s;
    double median = 0, mfu = 0;
  };
  std::vector<Row> rows = {{8, 32, {}}, {2, 128, {}}, {1, 256, {}}};
  double flops_per_sample = 0;
  for (int rep = 0; rep < f.repeats; ++rep) {  // interleaved, so drift hits all rows alike
    for (auto& row : rows) {
      train::TrainConfig c;
      c.replicas = row.replicas;
      c.micro_batch = row.micro_batch;
      c.steps = f.warmup + f.steps;
      c.warmup_steps = f.warmup;
      c.evaluate = false;
      c.log_every = 1 << 30;
      c.peak_flops = peak;
      const auto r = train::train(c, data);
      row.samples_per_s.push_back(r.samples_per_s);
      flops_per_sample = r.flops_per_sample;
    }
  }
  double best = 0;
  for (auto& row : rows) {
    auto v = row.samples_per_s;
    std::sort(v.begin(), v.end());
    row.median = v[v.size() / 2];
    row.mfu = row.median * flops_per_sample / peak;
    best = std::max(best, row.median);
  }
  if (f.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& row : rows) {
      out.push_back({{"replicas", row.replicas},
                     {"micro_batch", row.micro_batch},
                     {"samples_per_s", row.median},
                     {"samples_per_s_runs", row.samples_per_s},
                     {"mfu", row.mfu},
                     {"fraction_of_best", row.median / best},
                     {"peak_sgemm_gflops", peak / 1e9},
                     {"flops_per_sample", flops_per_sample},
                     {"blas_core", nn::blas_core_name()}});
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("peak sgemm on all cores: %.1f GFLOP/s (OpenBLAS %s kernels); model: %.2f MFLOP per sample\n",
              peak / 1e9, nn::blas_core_name().c_str(), flops_per_sample / 1e6);
  std::printf("median of %d runs of %lld steps (after %lld warm-up steps), global batch 256\n\n", f.repeats,
              (long long)f.steps, (long long)f.warmup);
  std::printf("%-18s %12s %8s %14s\n", "config", "samples/s", "MFU", "vs best");
  for (const auto& row : rows) {
    char name[32];
    std::snprintf(name, sizeof name, "%d x %lld", row.replicas, (long long)row.micro_batch);
    std::printf("%-18s %12.0f %8.3f %14.3f\n", name, row.median, row.mfu, row.median / best);
  }
  return 0;
}

}  // namespace

Action add_bench_train_command(CLI::App& bench) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd =
      bench.add_subcommand("train", "Training throughput and MFU for 8 x 32, 2 x 128 and 1 x 256");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--data", flags->data_dir, "Directory of an IDX data set");
  cmd->add_option("--steps", flags->steps, "Timed steps per run")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_option("--warmup", flags->warmup, "Untimed steps before each run")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  cmd->add_option("--repeats", flags->repeats, "Runs per configuration; the median is reported")
      ->check(CLI::Range(1, 100));
  cmd->add_flag("--json", flags->json, "Print JSON instead of a table");
  return [flags] { return run_bench_train(*flags); };
}

}  // namespace lockstep::cli
