// `lockstep bench allreduce`: all-reduce time and bandwidth, nccl-tests style.
//
// For each size P (bytes per rank): the median over repeats of one float-sum
// all-reduce on N in-process replicas, and
//   algbw = P / time,  busbw = algbw * 2(N-1)/N,
//   memory_traffic_ratio = (2 N P / time) / memcpy bandwidth,
// where 2NP is the least memory traffic any all-reduce of N buffers can have
// (every input read once, every output written once) and the memcpy
// bandwidth (bytes read + written per second, all cores) is measured in the
// same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/comm/threads.h"
#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string sizes = "4K,16K,64K,256K,1M,4M,16M,64M,256M";
  int replicas = 8;
  std::string algorithm = "auto";
  int repeats = 0;  // 0: adaptive
  bool no_verify = false;
  bool json = false;
};

std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  double mult = 1;
  if (unit == "K" || unit == "KiB")
    mult = 1024;
  else if (unit == "M" || unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    throw InvalidArgument("--sizes: cannot read '" + s + "'; use e.g. 4K,1M,256M");
  if (end == s.c_str() || !(v >= 0) || !(v * mult <= double(std::size_t{1} << 40))) {
    throw InvalidArgument("--sizes: cannot read '" + s + "'; use sizes from 0 to 1T such as 4K,1M,256M");
  }
  const auto bytes = static_cast<std::size_t>(v * mult);
  if (bytes % sizeof(float) != 0) throw InvalidArgument("--sizes: " + s + " is not a whole number of floats");
  return bytes;
}

// Bytes read + written per second by one memcpy per core over 256 MiB.
double memcpy_bandwidth() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::size_t per = (256u << 20) / cores;
  std::vector<std::vector<char>> src(cores, std::vector<char>(per, 1)), dst(cores, std::vector<char>(per, 2));
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    std::vector<std::thread> t;
    for (int c = 0; c < cores; ++c)
      t.emplace_back([&, c] { std::memcpy(dst[c].data(), src[c].data(), per); });
    for (auto& th : t) th.join();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * per * cores / s);
  }
  return best;
}

// Median seconds of one all-reduce of `bytes` per rank on `n` replicas.
double time_allreduce(int n, std::size_t bytes, comm::Algorithm algorithm, int repeats, bool verify) {
  auto comms = comm::make_thread_group({.world_size = n});
  const std::size_t count = bytes / sizeof(float);
  if (repeats <= 0)
    repeats = static_cast<int>(std::clamp<double>(2e8 / std::max<double>(bytes * n, 1), 5, 2000));
  std::vector<double> samples(repeats);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      comm::Communicator& c = *comms[r];
      try {
        std::vector<float> buf(count, 1.0f);
        const comm::AllreduceOptions options{
            .op = comm::ReduceOp::Sum, .algorithm = algorithm, .verify = verify};
        for (int w = 0; w < 2; ++w) comm::allreduce(c, buf, options);
        for (int i = 0; i < repeats; ++i) {
          comm::barrier(c);
          const auto t0 = Clock::now();
          comm::allreduce(c, buf, options);
          if (r == 0) samples[i] = std::chrono::duration<double>(Clock::now() - t0).count();
        }
      } catch (...) {  // e.g. out of memory for a huge size: stop the others, report after join
        errors[r] = std::current_exception();
        c.abort("rank " + std::to_string(r) + " failed");
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

int run(const Flags& f) {
  std::vector<std::size_t> sizes;
  for (std::size_t pos = 0; pos <= f.sizes.size();) {
    const std::size_t comma = std::min(f.sizes.find(',', pos), f.sizes.size());
    sizes.push_back(parse_size(f.sizes.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  const auto algorithm = comm::algorithm_from_string(f.algorithm);
  const double memcpy_bw = memcpy_bandwidth();
  const int n = f.replicas;
  nlohmann::json rows = nlohmann::json::array();
  if (!f.json) {
    std::printf(
        "all-reduce (float sum), %d replicas, algorithm %s; memcpy bandwidth %.1f GB/s (read+write, all "
        "cores)\n\n",
        n, f.algorithm.c_str(), memcpy_bw / 1e9);
    std::printf("%12s %12s %12s %12s %10s\n", "bytes", "time_us", "algbw_GB/s", "busbw_GB/s", "mem_ratio");
  }
  for (std::size_t bytes : sizes) {
    const double t = time_allreduce(n, bytes, algorithm, f.repeats, !f.no_verify);
    const double algbw = bytes / t / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    const double ratio = 2.0 * n * bytes / t / memcpy_bw;
    rows.push_back({{"bytes", bytes},
                    {"algorithm", f.algorithm},
                    {"replicas", n},
                    {"time_us", t * 1e6},
                    {"algbw_gbps", algbw},
                    {"busbw_gbps", busbw},
                    {"memory_traffic_ratio", ratio},
                    {"memcpy_gbps", memcpy_bw / 1e9}});
    if (!f.json) std::printf("%12zu %12.1f %12.2f %12.2f %10.2f\n", bytes, t * 1e6, algbw, busbw, ratio);
  }
  if (f.json) std::cout << rows.dump(2) << "\n";
  return 0;
}

}  // namespace

Action add_bench_allreduce_command(CLI::App& bench) {
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd =
      bench.add_subcommand("allreduce", "All-reduce time, algbw, busbw and memory-traffic ratio by size");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--sizes", flags->sizes, "Bytes per rank, comma-separated (K, M, G suffixes)");
  cmd->add_option("--replicas", flags->replicas, "Number of in-process replicas")->check(CLI::Range(1, 1024));
  cmd->add_option("--algorithm", flags->algorithm, "All-reduce algorithm")
      ->check(CLI::IsMember({"auto", "ring", "halving_doubling", "naive", "shared_memory"}));
  cmd->add_option("--repeats", flags->repeats, "Timed calls per size (0: adaptive); the median is reported")
      ->check(CLI::Range(0, 100000));
  cmd->add_flag("--no-verify", flags->no_verify, "Skip the fingerprint check (to measure what it costs)");
  cmd->add_flag("--json", flags->json, "Print JSON instead of a table");
  return [flags] { return run(*flags); };
}

}  // namespace lockstep::cli
