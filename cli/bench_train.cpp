// `lockstep bench train`: end-to-end training throughput and MFU.
//
// Runs the same global batch (256) as 8 x 32, 2 x 128 and 1 x 256 on the
// default model and data, each `repeats` times, and reports the median
// samples/s, MFU against the peak sgemm FLOP/s measured in the same run, and
// each configuration's throughput relative to the best one. 2 x 32 is
// reported beside them: the same forward and backward work per sample and the
// same optimizer steps per sample as 8 x 32, with a quarter of the replicated
// state. It all-reduces fewer bytes per replica (2P(N-1)/N: 1.0 P against
// 1.75 P per step), so the two differ by what eight copies of the state cost
// in the caches plus that part of the all-reduce.
//
// Then the model's matrix products alone, with no training around them: each
// replica's forward, weight-gradient and input-gradient sgemm calls on its own
// copy of the weights, one thread per replica as in the trainer. A step
// cannot be faster than its matrix products, so a
// configuration's matmul samples/s over the best whole-step samples/s bounds
// its "vs best" from above.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "checks.h"
#include "commands.h"
#include "host_memory.h"
#include "lockstep/error.h"
#include "lockstep/nn/gemm.h"
#include "lockstep/train/trainer.h"
#include "median.h"
#include "peak_flops.h"

namespace lockstep::cli {
namespace {

struct BenchFlags {
  std::string data_dir = data::default_data_dir().string();
  std::int64_t steps = 100;
  std::int64_t warmup = 10;
  int repeats = 3;
  int zero = 0;            // --zero 1 for every row of more than one replica
  double peak_gflops = 0;  // --peak-gflops; 0 = measure it
  bool json = false;
};

// Samples/s of the MLP's matrix products alone: `replicas` copies of the
// weights (layer widths `dims`), micro-batch `batch`, for `steps` steps. As in
// the trainer, each replica is a thread of its own, and the BLAS gets one
// thread per replica unless there are fewer replicas than cores (then it gets
// cores / replicas). Every thread warms up (pages touched, BLAS buffers
// allocated) before the clock starts, and the clock stops when the last one
// ends.
double matmul_samples_per_s(const std::vector<std::int64_t>& dims, int replicas, std::int64_t batch,
                            std::int64_t steps, int cores) {
  using nn::Trans;
  struct Replica {
    std::vector<std::vector<float>> w, dw, act, grad;  // per layer; act/grad per layer boundary
  };
  std::vector<Replica> reps(static_cast<std::size_t>(replicas));
  const std::size_t layers = dims.size() - 1;
  for (auto& r : reps) {
    for (std::size_t l = 0; l < layers; ++l) {
      r.w.emplace_back(static_cast<std::size_t>(dims[l] * dims[l + 1]), 0.01f);
      r.dw.emplace_back(static_cast<std::size_t>(dims[l] * dims[l + 1]), 0.0f);
    }
    for (const std::int64_t d : dims) {
      r.act.emplace_back(static_cast<std::size_t>(batch * d), 0.5f);
      r.grad.emplace_back(static_cast<std::size_t>(batch * d), 0.01f);
    }
  }
  // The calls nn::Linear makes, in the same order, with the same betas: the
  // trainer's backward accumulates into the gradients the optimizer zeroed
  // (beta 1 for the weight gradient), and writes the input gradients (beta 0).
  auto step = [&](Replica& r) {
    for (std::size_t l = 0; l < layers; ++l)
      nn::sgemm(Trans::No, Trans::Yes, batch, dims[l + 1], dims[l], 1.0f, r.act[l].data(), dims[l], r.w[l].data(),
                dims[l], 1.0f, r.act[l + 1].data(), dims[l + 1]);
    for (std::size_t l = layers; l-- > 0;) {
      nn::sgemm(Trans::Yes, Trans::No, dims[l + 1], dims[l], batch, 1.0f, r.grad[l + 1].data(), dims[l + 1],
                r.act[l].data(), dims[l], 1.0f, r.dw[l].data(), dims[l]);
      if (l > 0)
        nn::sgemm(Trans::No, Trans::No, batch, dims[l], dims[l + 1], 1.0f, r.grad[l + 1].data(), dims[l + 1],
                  r.w[l].data(), dims[l], 0.0f, r.grad[l].data(), dims[l]);
    }
  };
  const int previous = nn::blas_threads();
  const int wanted = replicas < cores ? cores / replicas : 1;
  nn::set_blas_threads(wanted);
  // The clock starts in the barrier's completion step, which runs after the
  // last thread arrives and before any is released.
  std::chrono::steady_clock::time_point t0;
  std::barrier warmed(replicas, [&t0]() noexcept { t0 = std::chrono::steady_clock::now(); });
  std::vector<std::jthread> pool;
  pool.reserve(static_cast<std::size_t>(replicas));
  try {
    for (int i = 0; i < replicas; ++i)
      pool.emplace_back([&, i] {
        Replica& r = reps[static_cast<std::size_t>(i)];
        for (int s = 0; s < 2; ++s) step(r);
        warmed.arrive_and_wait();
        for (std::int64_t s = 0; s < steps; ++s) step(r);
      });
  } catch (...) {  // no thread: stand in for the missing ones, so the started ones are released and joined
    for (std::size_t i = pool.size(); i < static_cast<std::size_t>(replicas); ++i) warmed.arrive_and_drop();
    throw;
  }
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (wanted != previous) nn::set_blas_threads(previous);
  return static_cast<double>(replicas * batch * steps) / s;
}

int run_bench_train(const BenchFlags& f) {
  const auto data = load_data(f.data_dir);
  if (data.train.size < 256) {  // 8 x 32, 2 x 128 and 1 x 256
    throw InvalidArgument("bench train runs global batches of up to 256 samples, and " + data.dir.string() +
                          " has " + std::to_string(data.train.size) + " training samples; give --data a larger set.");
  }
  const HostCores host = host_cores();
  struct Row {
    int replicas;
    std::int64_t micro_batch;
    std::vector<double> samples_per_s;
    std::vector<double> matmul_samples_per_s;
    double median = 0, mfu = 0, matmul_median = 0;
  };
  std::vector<Row> rows = {{8, 32, {}, {}}, {2, 32, {}, {}}, {2, 128, {}, {}}, {1, 256, {}, {}}};
  auto config_of = [&](const Row& row) {
    train::TrainConfig c;
    c.cores = host.process;
    c.replicas = row.replicas;
    c.micro_batch = row.micro_batch;
    c.steps = f.warmup + f.steps;
    c.warmup_steps = f.warmup;
    c.evaluate = false;
    c.log_every = 1 << 30;
    c.stop_poll_ms = 1e12;  // and no stop votes between: nothing but the step is timed
    c.zero = row.replicas > 1 ? f.zero : 0;  // one replica has nothing to shard
    return c;
  };
  // Before anything is measured: eight replicas of the default MLP on a data
  // set of large inputs (its first layer is features x 512) may not fit, and
  // the kernel's OOM killer ended such a run without a word.
  for (const auto& row : rows) check_memory(config_of(row), data, row.replicas);
  const bool peak_given = f.peak_gflops > 0;
  double peak = peak_given ? f.peak_gflops * 1e9 : measure_peak_sgemm_flops(host);
  std::vector<std::int64_t> dims = {data.train.features};
  const train::TrainConfig defaults;
  dims.insert(dims.end(), defaults.hidden.begin(), defaults.hidden.end());
  dims.push_back(data.train.num_classes);
  double flops_per_sample = 0;
  for (int rep = 0; rep < f.repeats; ++rep) {  // interleaved, so drift hits all rows alike
    for (auto& row : rows) {
      row.matmul_samples_per_s.push_back(
          matmul_samples_per_s(dims, row.replicas, row.micro_batch, f.steps * 256 / (row.replicas * row.micro_batch),
                               host.process));
      train::TrainConfig c = config_of(row);
      c.peak_flops = peak;
      const auto r = train::train(c, data);
      row.samples_per_s.push_back(r.samples_per_s);
      flops_per_sample = r.flops_per_sample;
    }
  }
  double best = 0;
  for (auto& row : rows) {
    row.median = median(row.samples_per_s);
    row.matmul_median = median(row.matmul_samples_per_s);
    best = std::max(best, row.median);
  }
  // A row that outran the peak measured before the runs (this machine's
  // speed varies; a busy hour reads a low peak): measure again and keep the
  // faster, as lockstep train does; if a row still outran it, say so below.
  if (!peak_given && best * flops_per_sample > peak) peak = std::max(peak, measure_peak_sgemm_flops(host));
  for (auto& row : rows) row.mfu = row.median * flops_per_sample / peak;
  const bool mfu_over_1 = best * flops_per_sample > peak;
  if (f.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& row : rows) {
      out.push_back({{"replicas", row.replicas},
                     {"micro_batch", row.micro_batch},
                     {"samples_per_s", row.median},
                     {"samples_per_s_runs", row.samples_per_s},
                     {"mfu", row.mfu},
                     {"fraction_of_best", row.median / best},
                     {"matmul_samples_per_s", row.matmul_median},
                     {"matmul_samples_per_s_runs", row.matmul_samples_per_s},
                     {"bound_on_fraction_of_best", std::min(1.0, row.matmul_median / best)},
                     {"matmul_below_step", row.matmul_median < row.median},
                     {"peak_sgemm_gflops", peak / 1e9},
                     {"peak_measured", !peak_given},
                     {"flops_per_sample", flops_per_sample},
                     {"zero", row.replicas > 1 ? f.zero : 0},
                     {"blas_core", nn::blas_core_name()}});
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (peak_given) {
    std::printf("peak: %.4g GFLOP/s (--peak-gflops); model: %.2f MFLOP per sample\n", peak / 1e9,
                flops_per_sample / 1e6);
  } else {
    std::printf("peak sgemm on all cores: %.1f GFLOP/s (OpenBLAS %s kernels); model: %.2f MFLOP per sample\n",
                peak / 1e9, nn::blas_core_name().c_str(), flops_per_sample / 1e6);
  }
  std::printf("median of %d runs of %lld steps (after %lld warm-up steps); global batch = replicas x "
              "micro-batch\n\n",
              f.repeats, (long long)f.steps, (long long)f.warmup);
  if (f.zero == 1) std::printf("--zero 1: the optimizer state sharded in every row of more than one replica\n\n");
  std::printf("%-10s %12s %8s %9s %16s %16s\n", "config", "samples/s", "MFU", "vs best", "matmuls alone",
              "bound on vs best");
  for (const auto& row : rows) {
    char name[32];
    std::snprintf(name, sizeof name, "%d x %lld", row.replicas, (long long)row.micro_batch);
    std::printf("%-10s %12.0f %8.3f %9.3f %16.0f %16.3f\n", name, row.median, row.mfu, row.median / best,
                row.matmul_median, std::min(1.0, row.matmul_median / best));
  }
  for (const auto& row : rows)
    if (row.matmul_median < row.median)
      std::printf("note: %d x %lld's matmuls alone measured slower than its whole steps, so its bound is\n"
                  "      not one in this run (noise, or the machine's speed changed between them)\n",
                  row.replicas, (long long)row.micro_batch);
  if (mfu_over_1) {
    std::printf(peak_given ? "note: MFU over 1: the runs were faster than the peak --peak-gflops gives; check the figure\n"
                           : "note: MFU over 1: the runs were faster than the sgemm peak measured before and after them\n"
                             "      (the best of both); the machine's speed varied, so take MFU as approximate\n");
  }
  std::printf(
      "\nmatmuls alone (samples/s): each replica's sgemm calls on its own weights and nothing else. A step\n"
      "cannot be faster than its matmuls, so matmuls alone / best step bounds 'vs best' from above.\n");
  return 0;
}

}  // namespace

Action add_bench_train_command(CLI::App& bench) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd =
      bench.add_subcommand("train", "Training throughput and MFU for 8 x 32, 2 x 32, 2 x 128 and 1 x 256, and their matrix products alone");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--data", flags->data_dir, "Directory of an IDX data set")
      ->check(not_empty());
  cmd->add_option("--steps", flags->steps, "Timed steps per run")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_option("--warmup", flags->warmup, "Untimed steps before each run")
      ->transform(whole_number_in(std::int64_t{0}, std::int64_t{1} << 20));
  cmd->add_option("--repeats", flags->repeats, "Runs per configuration; the median is reported")
      ->transform(whole_number_in(1, 100));
  cmd->add_option("--zero", flags->zero,
                  "ZeRO stage of the rows with more than one replica: 0 replicated, 1 sharded optimizer state")
      ->transform(whole_number_in(0, 1));  // not IsMember: "--zero: 1.5" said nothing
  cmd->add_option("--peak-gflops", flags->peak_gflops,
                  "MFU against this sgemm peak, in GFLOP/s (a device's rated figure, or one figure for runs you "
                  "compare), instead of one measured on all cores (0: measure it)")
      ->check(off_or_float_number(1e9));
  cmd->add_flag("--json", flags->json, "Print JSON instead of a table");
  return [flags] { return run_bench_train(*flags); };
}

}  // namespace lockstep::cli
