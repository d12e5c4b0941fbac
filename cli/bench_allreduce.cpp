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
//
// With --backend gloo (or mpi) every process runs the sweep as one rank of
// the group (ranks, world size and rendezvous from the shared process-group
// flags or the environment), and rank 0 prints the table or JSON; --algorithm
// native times the transport library's own all-reduce.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "checks.h"
#include "commands.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/comm/threads.h"
#include "lockstep/error.h"
#include "host_memory.h"
#include "median.h"
#include "peak_flops.h"
#include "process_group_flags.h"

namespace lockstep::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string sizes = "4K,16K,64K,256K,1M,4M,16M,64M,256M";
  int replicas = 8;
  bool replicas_given = false;
  std::string algorithm = "auto";
  int repeats = 0;  // 0: adaptive
  bool no_verify = false;
  bool json = false;
  ProcessGroupFlags group;  // --backend threads (the default): `replicas` threads of this process
  const CLI::App* cmd = nullptr;  // which flags were given
};

std::size_t parse_size(const std::string& s) {
  // strtod reads "0x10" as hexadecimal (16 bytes): decimal only.
  if (s.find_first_of("xXpP") != std::string::npos)
    throw InvalidArgument("--sizes: cannot read '" + s + "'; use decimal bytes with a K, M, G or T suffix, e.g. 4K,1M,256M");
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  // "1e-400" is read as 0 with ERANGE: it was timed as 0 bytes.
  const bool underflow = errno == ERANGE && v == 0;
  std::string unit(end);
  double mult = 1;
  if (unit == "K" || unit == "KiB")
    mult = 1024;
  else if (unit == "M" || unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    throw InvalidArgument("--sizes: cannot read '" + s + "'; use bytes with a K, M, G or T suffix, e.g. 4K,1M,256M");
  if (end == s.c_str() || underflow || !(v >= 0) || !(v * mult <= double(std::size_t{1} << 40))) {
    throw InvalidArgument("--sizes: cannot read '" + s + "'; use sizes from 0 to 1T such as 4K,1M,256M");
  }
  // The cast truncates: "4.5" was timed as 4 bytes and "1e-9" as 0, each
  // printed as if asked for.
  if (v * mult != std::floor(v * mult)) {
    throw InvalidArgument("--sizes: " + s +
                          " is not a whole number of bytes; give whole bytes, such as 4K or 1536.");
  }
  const auto bytes = static_cast<std::size_t>(v * mult);
  if (bytes % sizeof(float) != 0) {
    throw InvalidArgument("--sizes: " + s + " is not a whole number of floats; give a multiple of 4 bytes.");
  }
  return bytes;
}

// Bytes read + written per second by one memcpy per core over 256 MiB, on
// every core of the host even in a bound process (peak_flops.h).
double memcpy_bandwidth() {
  const HostCores host = host_cores();
  const int cores = host.cores;  // as many as run_on_every_core runs
  const std::size_t per = (256u << 20) / cores;
  std::vector<std::vector<char>> src(cores, std::vector<char>(per, 1)), dst(cores, std::vector<char>(per, 2));
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    run_on_every_core(host, [&](int c) { std::memcpy(dst[c].data(), src[c].data(), per); });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * per * cores / s);
  }
  return best;
}

int adaptive_repeats(std::size_t bytes, int n, int repeats) {
  if (repeats > 0) return repeats;
  return static_cast<int>(std::clamp<double>(2e8 / std::max<double>(bytes * n, 1), 5, 2000));
}

// One rank's side of the timing: two warm-up calls, then `repeats` timed
// calls, each after a barrier. Fills `samples` (seconds) when it is non-null.
void time_on_rank(comm::Communicator& c, std::size_t bytes, comm::Algorithm algorithm, int repeats, bool verify,
                  std::vector<double>* samples) {
  std::vector<float> buf(bytes / sizeof(float), 1.0f);
  const comm::AllreduceOptions options{.op = comm::ReduceOp::Sum, .algorithm = algorithm, .verify = verify};
  for (int w = 0; w < 2; ++w) comm::allreduce(c, buf, options);
  for (int i = 0; i < repeats; ++i) {
    comm::barrier(c);
    const auto t0 = Clock::now();
    comm::allreduce(c, buf, options);
    if (samples) (*samples)[i] = std::chrono::duration<double>(Clock::now() - t0).count();
  }
}

// The in-process group of `f`: --timeout applies to it as to a process
// group's (it was left at the default 60 s, whatever --timeout said).
comm::ThreadGroupOptions thread_group_options(const Flags& f) {
  return {.world_size = f.replicas,
          .timeout = comm::Duration(static_cast<std::int64_t>(std::ceil(f.group.timeout_s * 1000))),
          .ranks_per_node = f.group.per_node};
}

// Median seconds of one all-reduce of `bytes` per rank on in-process replicas.
double time_allreduce(const comm::ThreadGroupOptions& group, std::size_t bytes, comm::Algorithm algorithm,
                      int repeats, bool verify) {
  const int n = group.world_size;
  auto comms = comm::make_thread_group(group);
  repeats = adaptive_repeats(bytes, n, repeats);
  std::vector<double> samples(repeats);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      comm::Communicator& c = *comms[r];
      try {
        time_on_rank(c, bytes, algorithm, repeats, verify, r == 0 ? &samples : nullptr);
      } catch (...) {  // e.g. out of memory for a huge size: stop the others, report after join
        errors[r] = std::current_exception();
        c.abort("rank " + std::to_string(r) + " failed");
      }
    });
  }
  for (auto& t : threads) t.join();
  // The first error that is not a consequence of another replica's abort
  // (as the trainer does): rank 0's CommAborted hid a rank's timeout, and
  // exited 3, "stopped because another rank of a process group failed".
  rethrow_first_cause(errors);
  return median(samples);
}

// Refuses sizes this host cannot hold before anything runs (the kernel's OOM
// killer ended such a run without a word): each of `ranks_here` ranks holds
// its buffer and scratch of up to the same size, and rank 0 first measures
// memcpy over 2 x 256 MiB.
void check_sizes_fit_in_memory(const Flags& f, std::size_t largest, int ranks_here) {
  const std::optional<double> available = available_memory_bytes();
  const double need = std::max(2.0 * double(largest) * ranks_here, 2.0 * (256 << 20));
  if (available && need > *available) {
    char text[320];
    std::snprintf(text, sizeof text,
                  "--sizes: an all-reduce of %zu bytes per rank on %d ranks here needs about %s (a buffer "
                  "and scratch per rank), and this host has %s free; give smaller --sizes%s.",
                  largest, ranks_here, show_bytes(need).c_str(), show_bytes(*available).c_str(),
                  backend_of(f.group) == comm::Backend::Threads ? " or fewer --replicas" : "");
    throw InvalidArgument(text);
  }
}

int run(const Flags& f) {
  std::vector<std::size_t> sizes;
  for (std::size_t pos = 0; pos <= f.sizes.size();) {
    const std::size_t comma = std::min(f.sizes.find(',', pos), f.sizes.size());
    sizes.push_back(parse_size(f.sizes.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  const auto algorithm = comm::algorithm_from_string(f.algorithm);
  const bool threads = backend_of(f.group) == comm::Backend::Threads;
  // An all-reduce over one rank returns at once, moving nothing: its rows
  // gave a busbw of 0 and a memory-traffic ratio of 4 to 5, "faster than
  // memcpy", for a call that does no work.
  const std::string alone =
      "an all-reduce over one rank returns at once and moves nothing, so there is nothing to time; ";
  if (threads && f.replicas < 2) {
    throw InvalidArgument("bench allreduce needs 2 or more replicas: " + alone +
                          "give --replicas 2 or more.");
  }
  check_group_flags(*f.cmd, f.group);
  check_nodes(f.group, f.replicas, algorithm, /*modelled_link=*/std::nullopt);
  if (threads && algorithm == comm::Algorithm::Native) {  // before anything is measured or printed
    throw InvalidArgument("the native all-reduce is a transport library's (Gloo's, MPI_Allreduce): give --backend "
                          "gloo or mpi with it; the threads backend's own is --algorithm shared_memory.");
  }
  check_sizes_fit_in_memory(f, *std::max_element(sizes.begin(), sizes.end()),
               threads ? f.replicas : ranks_here_before_rendezvous(f.group));
  // A process group: this process is one rank; rank 0 measures memcpy (the
  // others wait in the first barrier) and prints.
  std::unique_ptr<comm::Communicator> group = threads ? nullptr : connect_process_group(f.group);
  // What the algorithm needs of the group (a power of two for the tree, ...),
  // before anything is measured or printed.
  // One rank of the group, to ask what the algorithm needs of it and, for
  // auto, which algorithm each size runs (the same on every rank).
  const auto probe_group = threads ? comm::make_thread_group(thread_group_options(f))
                                   : std::vector<std::unique_ptr<comm::Communicator>>{};
  comm::Communicator& probe = threads ? *probe_group.front() : *group;
  comm::check_algorithm(probe, algorithm);
  if (!threads && group->size() < 2) {
    throw InvalidArgument("bench allreduce needs a process group of 2 or more ranks: " + alone +
                          "start 2 or more (--world-size, lockstep launch --nproc).");
  }
  if (!threads && f.replicas_given && f.replicas != group->size()) {  // as train: it may only agree
    comm::refuse_call(*group, "--replicas " + std::to_string(f.replicas) + " does not match the world size " +
                                  std::to_string(group->size()) + " of the process group; leave --replicas out.");
  }
  const bool printer = threads || group->rank() == 0;
  const double memcpy_bw = printer ? memcpy_bandwidth() : 0;
  const int n = threads ? f.replicas : group->size();
  std::string what = threads ? std::to_string(n) + " replicas"
                             : std::to_string(n) + " ranks (" + f.group.backend + " processes)";
  if (f.group.per_node > 0) what += " in nodes of " + std::to_string(f.group.per_node);
  nlohmann::json rows = nlohmann::json::array();
  if (!f.json && printer) {
    std::printf(
        "all-reduce (float sum), %s, algorithm %s; memcpy bandwidth %.1f GB/s (read+write, all "
        "cores)\n\n",
        what.c_str(), f.algorithm.c_str(), memcpy_bw / 1e9);
    std::printf("%12s %12s %12s %12s %10s  %s\n", "bytes", "time_us", "algbw_GB/s", "busbw_GB/s", "mem_ratio",
                "ran");
  }
  for (std::size_t bytes : sizes) {
    double t = 0;
    if (threads) {
      t = time_allreduce(thread_group_options(f), bytes, algorithm, f.repeats, !f.no_verify);
    } else {
      std::vector<double> samples(adaptive_repeats(bytes, n, f.repeats));
      time_on_rank(*group, bytes, algorithm, static_cast<int>(samples.size()), !f.no_verify, &samples);
      t = median(samples);
      if (!printer) continue;
    }
    const double algbw = bytes / t / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    const double ratio = 2.0 * n * bytes / t / memcpy_bw;
    const char* ran = comm::to_string(comm::algorithm_for(probe, bytes, algorithm));
    rows.push_back({{"bytes", bytes},
                    {"algorithm", f.algorithm},
                    {"algorithm_run", ran},
                    {"replicas", n},
                    {"backend", f.group.backend},
                    {"time_us", t * 1e6},
                    {"algbw_gbps", algbw},
                    {"busbw_gbps", busbw},
                    {"memory_traffic_ratio", ratio},
                    {"memcpy_gbps", memcpy_bw / 1e9}});
    if (!f.json) std::printf("%12zu %12.1f %12.2f %12.2f %10.2f  %s\n", bytes, t * 1e6, algbw, busbw, ratio, ran);
  }
  if (f.json && printer) std::cout << rows.dump(2) << "\n";
  return 0;
}

}  // namespace

Action add_bench_allreduce_command(CLI::App& bench) {
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd =
      bench.add_subcommand("allreduce", "All-reduce time, algbw, busbw and memory-traffic ratio by size");
  cmd->option_defaults()->always_capture_default();
  flags->cmd = cmd;
  cmd->add_option("--sizes", flags->sizes,
                  "Bytes per rank, comma-separated (K, M, G, T suffixes: powers of 1024)");
  cmd->add_option("--replicas", flags->replicas,
                  "Number of in-process replicas, 2 or more (--backend threads)")
      ->transform(whole_number_in(1, 1024))
      ->each([flags](const std::string&) { flags->replicas_given = true; });
  cmd->add_option("--algorithm", flags->algorithm, "All-reduce algorithm")
      ->check(CLI::IsMember({"auto", "ring", "halving_doubling", "naive", "shared_memory", "native", "tree", "hierarchical"}));
  cmd->add_option("--repeats", flags->repeats, "Timed calls per size (0: adaptive); the median is reported")
      ->transform(whole_number_in(0, 100000));
  cmd->add_flag("--no-verify", flags->no_verify, "Skip the fingerprint check (to measure what it costs)");
  cmd->add_flag("--json", flags->json, "Print JSON instead of a table");
  add_process_group_flags(*cmd, flags->group);
  return [flags] { return run(*flags); };
}

}  // namespace lockstep::cli
