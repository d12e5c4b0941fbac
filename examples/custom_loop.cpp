// custom_loop: lockstep as a library, with your own model and your own training loop.
//
// N replicas (threads, or processes) train one small MLP, 16 -> 32 (ReLU) -> 4 softmax, on
// synthetic Gaussian blobs. The model, its gradient and SGD are plain loops written here;
// lockstep only supplies the data-parallel parts:
//   comm::make_thread_group     N connected communicators, one per replica
//   comm::connect               or, with --backend gloo|mpi, this process's communicator in a
//                               group of processes (one replica each; run_processes.sh starts them)
//   comm::with_modelled_link    (optional) make every message pay a bandwidth and a latency
//   comm::broadcast             replica 0's initial weights to all
//   ddp::DistributedSampler     which samples each replica sees at each step (disjoint shards)
//   ddp::Reducer                the gradient all-reduce, in buckets, overlapping the backward pass
//   comm::allreduce             the global loss and the held-out accuracy
// At the end it checks that all replicas hold bitwise identical weights, that the loss went
// down and that held-out accuracy is above 90%; it exits 1 if not. The train_replica loop is
// the same code in both modes: nothing in it knows whether its peers are threads or processes.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/collectives.h"
#include "lockstep/comm/modelled_link.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/comm/threads.h"
#include "lockstep/ddp/grad_clip.h"
#include "lockstep/ddp/reducer.h"
#include "lockstep/ddp/sampler.h"
#include "lockstep/error.h"

namespace comm = lockstep::comm;
namespace ddp = lockstep::ddp;

constexpr int kIn = 16, kHidden = 32, kClasses = 4;
constexpr std::int64_t kMicroBatch = 32;  // samples per replica per step
constexpr float kLearningRate = 0.1f;

// Gaussian blobs: class c is N(centre_c, I) in 16-D, centres drawn once from N(0, 1.5^2 I).
struct Data {
  std::vector<float> x;  // (n, kIn)
  std::vector<int> y;    // (n)
};
void make_blobs(std::uint64_t seed, int n_train, int n_test, Data& train, Data& test) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> centres(kClasses * kIn);
  for (float& c : centres) c = 1.5f * normal(rng);
  for (Data* d : {&train, &test}) {
    const int n = d == &train ? n_train : n_test;
    for (int i = 0; i < n; ++i) {
      const int c = static_cast<int>(rng() % kClasses);
      d->y.push_back(c);
      for (int j = 0; j < kIn; ++j) d->x.push_back(centres[c * kIn + j] + normal(rng));
    }
  }
}

// All parameters live in one contiguous vector, tensors in forward order [W1, b1, W2, b2];
// the gradients live in a second vector with the same layout. The reducer sees only the
// gradient vector and these sizes.
constexpr std::size_t kW1 = 0, kB1 = kW1 + kHidden * kIn, kW2 = kB1 + kHidden, kB2 = kW2 + kClasses * kHidden,
                      kNumParams = kB2 + kClasses;
const std::vector<std::size_t> kTensorNumels = {kB1 - kW1, kW2 - kB1, kB2 - kW2, kNumParams - kB2};

// Forward for one sample, x: (kIn) -> h: (kHidden), p: (kClasses) softmax probabilities.
void forward(const float* w, const float* x, float* h, float* p) {
  for (int i = 0; i < kHidden; ++i) {
    float a = w[kB1 + i];
    for (int j = 0; j < kIn; ++j) a += w[kW1 + i * kIn + j] * x[j];
    h[i] = std::max(a, 0.0f);
  }
  float max_logit = -INFINITY, sum = 0;
  for (int k = 0; k < kClasses; ++k) {
    p[k] = w[kB2 + k];
    for (int i = 0; i < kHidden; ++i) p[k] += w[kW2 + k * kHidden + i] * h[i];
    max_logit = std::max(max_logit, p[k]);
  }
  for (int k = 0; k < kClasses; ++k) sum += p[k] = std::exp(p[k] - max_logit);
  for (int k = 0; k < kClasses; ++k) p[k] /= sum;
}

// One replica: the whole training loop, run on its own thread.
struct Result {
  float first_loss = 0, last_loss = 0, accuracy = 0;
  int clipped_steps = 0;
};
void train_replica(comm::Communicator& c, const Data& train, const Data& test, int steps, float clip_norm,
                   std::vector<float>& w, Result& result) {
  const int rank = c.rank(), n = c.size();
  // Replica 0 initialises (He-scaled normal weights, zero biases); broadcast gives everyone
  // its bytes, so all replicas start bitwise identical.
  if (rank == 0) {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = kW1; i < kB1; ++i) w[i] = normal(rng) * std::sqrt(2.0f / kIn);
    for (std::size_t i = kW2; i < kB2; ++i) w[i] = normal(rng) * std::sqrt(2.0f / kHidden);
  }
  comm::broadcast(c, std::span<float>(w), /*root=*/0);

  // Every replica builds the same sampler; shard(step, rank) is this replica's slice.
  const ddp::DistributedSampler sampler({.dataset_size = static_cast<std::int64_t>(train.y.size()),
                                         .world_size = n,
                                         .micro_batch = kMicroBatch,
                                         .seed = 7});
  // Small buckets so that this tiny model still gets three: {b2, W2} (first cap 512 B),
  // then {b1} and {W1} (cap 128 B). Constructing the reducer is a collective.
  std::vector<float> grad(kNumParams);
  ddp::Reducer reducer(c, grad, kTensorNumels,
                       {.first_bucket_mb = 512.0 / (1 << 20), .bucket_mb = 128.0 / (1 << 20)});
  // Buckets are launched in order 0, 1, 2, each holding a contiguous range of `grad`.
  const char* names[] = {"W1", "b1", "W2", "b2"};
  for (std::size_t k = 0; rank == 0 && k < reducer.buckets().size(); ++k) {
    const ddp::Bucket& bucket = reducer.buckets()[k];
    std::printf("bucket %zu: %4zu bytes, tensors", k, bucket.bytes());
    for (std::size_t t : bucket.tensors) std::printf(" %s", names[t]);
    std::printf("\n");
  }

  // Optional clipping of the averaged gradient to a global L2 norm: every replica computes
  // the same norm, to the bit, so all scale alike and stay identical.
  std::optional<ddp::GradClipper> clipper;
  if (clip_norm > 0) clipper.emplace(reducer.buckets(), rank, n, grad.size(), ddp::GradClipOptions{.max_norm = clip_norm});

  std::vector<std::int64_t> order;
  std::vector<float> h(kMicroBatch * kHidden), dlogits(kMicroBatch * kClasses);
  for (int step = 0; step < steps; ++step) {
    const std::int64_t epoch = step / sampler.steps_per_epoch(), s = step % sampler.steps_per_epoch();
    if (s == 0) order = sampler.epoch_order(epoch);  // the same order on every replica
    const ddp::Shard shard = sampler.shard(s, rank);
    const auto m = static_cast<int>(shard.size());

    // Forward over the micro-batch; dlogits = (p - onehot) / m is d(mean loss)/d(logits).
    float loss = 0;
    for (int b = 0; b < m; ++b) {
      const auto i = order[shard.begin + b];
      float p[kClasses];
      forward(w.data(), &train.x[i * kIn], &h[b * kHidden], p);
      loss -= std::log(std::max(p[train.y[i]], 1e-12f));
      for (int k = 0; k < kClasses; ++k) dlogits[b * kClasses + k] = (p[k] - (k == train.y[i])) / m;
    }

    // Backward, last layer first. Each tensor is handed to the reducer the moment its
    // gradient is complete; a full bucket starts its all-reduce while we keep computing.
    reducer.begin_step(shard.size(), shard.global_count);
    std::fill(grad.begin(), grad.end(), 0.0f);
    for (int b = 0; b < m; ++b)
      for (int k = 0; k < kClasses; ++k) {
        grad[kB2 + k] += dlogits[b * kClasses + k];
        for (int i = 0; i < kHidden; ++i)
          grad[kW2 + k * kHidden + i] += dlogits[b * kClasses + k] * h[b * kHidden + i];
      }
    reducer.mark_ready(3);  // b2
    reducer.mark_ready(2);  // W2: bucket 0 is full and goes on the wire now
    for (int b = 0; b < m; ++b) {
      const float* x = &train.x[order[shard.begin + b] * kIn];
      for (int i = 0; i < kHidden; ++i) {
        if (h[b * kHidden + i] <= 0) continue;  // ReLU passes no gradient
        float dh = 0;
        for (int k = 0; k < kClasses; ++k) dh += dlogits[b * kClasses + k] * w[kW2 + k * kHidden + i];
        grad[kB1 + i] += dh;
        for (int j = 0; j < kIn; ++j) grad[kW1 + i * kIn + j] += dh * x[j];
      }
    }
    reducer.mark_ready(1);  // b1
    reducer.mark_ready(0);  // W1
    reducer.finish_step();  // grad is now the mean over the whole global batch, on every replica
    if (clipper) result.clipped_steps += clipper->clip(c, grad).clipped ? 1 : 0;

    // Plain SGD. Same gradient, same weights: the replicas stay identical without talking.
    for (std::size_t i = 0; i < kNumParams; ++i) w[i] -= kLearningRate * grad[i];

    // The global batch loss, every 25 steps. Outside a step the communicator is ours again.
    if (step % 25 == 0 || step == steps - 1) {
      float sums[2] = {loss, static_cast<float>(m)};
      comm::allreduce(c, sums);
      const float global_loss = sums[0] / sums[1];
      if (step == 0) result.first_loss = global_loss;
      result.last_loss = global_loss;
      if (rank == 0)
        std::printf("step %4d  epoch %lld  loss %.4f\n", step, static_cast<long long>(epoch), global_loss);
    }
  }

  // Held-out accuracy: each replica scores its own chunk of the test set; a sum adds them up.
  const auto t = static_cast<std::int64_t>(test.y.size());
  float counts[2] = {0, 0};
  for (std::int64_t i = t * rank / n; i < t * (rank + 1) / n; ++i) {
    float hid[kHidden], p[kClasses];
    forward(w.data(), &test.x[i * kIn], hid, p);
    counts[0] += static_cast<float>(std::max_element(p, p + kClasses) - p == test.y[i]);
    counts[1] += 1;
  }
  comm::allreduce(c, counts);
  result.accuracy = counts[0] / counts[1];
}

// The invariants data-parallel training promises, checked outside the library: every
// replica's weights are replica 0's bits (`differing` names those that are not), the loss
// fell, held-out accuracy is above 90%. Every line starts with `prefix` ("rank 1 of 3: " for a
// process), and the lines go out in one write, so that processes sharing a terminal or a pipe do
// not interleave them.
bool check_invariants(const std::vector<std::string>& differing, const Result& r0, float clip_norm, int steps,
                      const std::string& prefix = "") {
  std::string out, failed;
  char line[160];
  std::snprintf(line, sizeof line, "held-out accuracy %.1f%%\n", 100.0 * r0.accuracy);
  out += prefix + line;
  if (clip_norm > 0) {
    std::snprintf(line, sizeof line, "gradient clipped to norm %g at %d of %d steps\n", clip_norm, r0.clipped_steps,
                  steps);
    out += prefix + line;
  }
  auto check = [&](bool cond, const std::string& what) {
    if (!cond) failed += prefix + "custom_loop: check failed: " + what + "\n";
  };
  for (const auto& who : differing) check(false, who + "'s weights differ from replica 0's");
  check(r0.last_loss < r0.first_loss, "the loss did not decrease");
  check(r0.accuracy > 0.9f, "held-out accuracy is not above 90%");
  if (failed.empty()) {
    std::snprintf(line, sizeof line, "ok: replicas bitwise identical, loss %.4f -> %.4f\n", r0.first_loss,
                  r0.last_loss);
    out += prefix + line;
  }
  std::fflush(stdout);  // what train_replica printed first
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  std::fwrite(failed.data(), 1, failed.size(), stderr);
  return failed.empty();
}

// --backend gloo|mpi: this process is one replica of a group (rank, world size and, for Gloo,
// the rendezvous from the flags or from RANK, WORLD_SIZE, LOCKSTEP_RENDEZVOUS). The same loop
// runs on the group's communicator; then each rank compares its weights with rank 0's
// (broadcast), and every rank learns whether any differed (all-reduce), so all exit alike.
bool run_as_process(comm::Backend backend, comm::ProcessGroupOptions options, const Data& train, const Data& test,
                    int steps, float clip_norm) {
  const auto group = comm::connect(backend, options);
  std::vector<float> mine(kNumParams, 0.0f);
  Result result;
  train_replica(*group, train, test, steps, clip_norm, mine, result);
  std::vector<float> rank0 = mine;
  comm::broadcast(*group, std::span<float>(rank0), /*root=*/0);
  float differ = std::memcmp(mine.data(), rank0.data(), kNumParams * sizeof(float)) != 0 ? 1 : 0;
  const bool this_one = differ > 0;
  comm::allreduce(*group, std::span<float>(&differ, 1), {.op = comm::ReduceOp::Max});  // any rank's
  std::vector<std::string> differing;
  if (differ > 0) differing.push_back(this_one ? "this rank" : "another rank");
  return check_invariants(differing, result, clip_norm, steps,
                          "rank " + std::to_string(group->rank()) + " of " + std::to_string(group->size()) + ": ");
}

int main(int argc, char** argv) {
  CLI::App app{"custom_loop: a hand-written MLP trained data-parallel with lockstep's comm and ddp",
               "custom_loop"};
  int replicas = 4, steps = 200;
  float clip_norm = 0;
  std::string bandwidth, latency, backend = "threads";
  comm::ProcessGroupOptions group_options;
  app.add_option("--replicas", replicas, "Number of replicas (threads)")->check(CLI::Range(1, 64));
  app.add_option("--backend", backend, "threads (--replicas in this process), or gloo | mpi (one per process)")
      ->check(CLI::IsMember({"threads", "gloo", "mpi"}));
  app.add_option("--rank", group_options.rank, "gloo: this process's rank (else RANK)");
  app.add_option("--world-size", group_options.world_size, "gloo: the number of processes (else WORLD_SIZE)");
  app.add_option("--rendezvous", group_options.rendezvous, "gloo: file:DIR or redis://HOST:PORT (else LOCKSTEP_RENDEZVOUS)");
  app.add_option("--steps", steps, "Training steps")->check(CLI::Range(1, 100000));
  app.add_option("--link-bandwidth", bandwidth, "Modelled link bandwidth, e.g. 10Gbit");
  app.add_option("--link-latency", latency, "Modelled link latency, e.g. 50us");
  app.add_option("--clip-grad-norm", clip_norm, "Clip the averaged gradient to this L2 norm (0: off)")
      ->check(CLI::Range(0.0f, 1e30f));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "custom_loop: error: %s (see --help)\n", e.what());
    return 2;
  }

  // A bad flag value, or a flag the chosen mode would ignore: a usage error, exit 2 as for what CLI11 refuses.
  comm::LinkModel link;
  try {
    if (!bandwidth.empty()) link.bytes_per_second = comm::parse_bandwidth(bandwidth);
    if (!latency.empty()) link.latency = comm::parse_latency(latency);

    // A flag the chosen mode would ignore is refused, not dropped without a word.
    for (const char* flag : {"--rank", "--world-size", "--rendezvous"}) {
      if (app.count(flag) > 0 && backend != "gloo") {
        throw lockstep::InvalidArgument(std::string(flag) + " is for --backend gloo (mpirun numbers its ranks)");
      }
    }
    if (app.count("--replicas") > 0 && backend != "threads") {
      throw lockstep::InvalidArgument("--replicas is for --backend threads; with processes, start one per replica");
    }
    if (backend != "threads" && link.enabled()) throw lockstep::InvalidArgument("a modelled link is for --backend threads");
  } catch (const lockstep::InvalidArgument& e) {
    std::fprintf(stderr, "custom_loop: error: %s\n", e.what());
    return 2;
  }

  try {
    Data train, test;
    make_blobs(/*seed=*/1, 4096, 1024, train, test);
    if (backend != "threads") {
      return run_as_process(comm::backend_from_string(backend), group_options, train, test, steps, clip_norm) ? 0 : 1;
    }
    std::printf(
        "custom_loop: %d replicas train a 16-32-4 MLP (own model, own loop) on Gaussian blobs;\n"
        "lockstep shards the data, all-reduces gradients in buckets; link: %s\n",
        replicas, link.describe().c_str());

    // One communicator per replica, optionally behind a modelled link, one thread each.
    auto group = comm::with_modelled_link(comm::make_thread_group({.world_size = replicas}), link);
    std::vector<std::vector<float>> weights(replicas, std::vector<float>(kNumParams, 0.0f));
    std::vector<Result> results(replicas);
    std::vector<std::exception_ptr> errors(replicas);
    std::vector<std::thread> threads;
    for (int r = 0; r < replicas; ++r)
      threads.emplace_back([&, r] {
        try {
          train_replica(*group[r], train, test, steps, clip_norm, weights[r], results[r]);
        } catch (...) {  // wake the other replicas instead of leaving them waiting for us
          errors[r] = std::current_exception();
          group[r]->abort("replica " + std::to_string(r) + " failed");
        }
      });
    for (auto& t : threads) t.join();
    // Report the cause: a replica's own error, not the CommAborted its abort gave the others.
    std::exception_ptr cause;
    for (auto& e : errors) {
      try {
        if (e) std::rethrow_exception(e);
      } catch (const lockstep::CommAborted&) {
        if (!cause) cause = e;
      } catch (...) {
        cause = e;
        break;
      }
    }
    if (cause) std::rethrow_exception(cause);

    std::vector<std::string> differing;
    for (int r = 1; r < replicas; ++r)
      if (std::memcmp(weights[r].data(), weights[0].data(), kNumParams * sizeof(float)) != 0)
        differing.push_back("replica " + std::to_string(r));
    return check_invariants(differing, results[0], clip_norm, steps) ? 0 : 1;
  } catch (const std::exception& e) {  // lockstep::Error and its kin (and bad_alloc): one line, exit 1
    std::fprintf(stderr, "custom_loop: error: %s\n", e.what());
    return 1;
  }
}
