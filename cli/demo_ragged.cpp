// `lockstep demo ragged`: the card's ragged-shard case on real data.
//
// First the card's premise: one global batch of 256 samples in eight equal
// shards of 32, whose plain average of means is the full-batch gradient
// ("a mean of equal-sized means is the mean of the whole"), up to float
// rounding. Then one global batch of 235 samples, cut as the card cuts it: seven replicas
// with 32 samples and one with 11. Each replica computes the mean gradient
// over its own shard. Then, against the gradient of one model over all 235:
//   plain     the average of the eight means (the short shard's samples
//             count 32/11 times too much): wrong;
//   weighted  the reducer with each replica weighted by its sample count
//             (Note [Ragged weighting] in src/ddp/reducer.cpp): exact;
//   pad       every shard padded to 32 rows, the padding masked out of the
//             loss, then weighted: exact, at the cost of computing 21 rows
//             of nothing on the short replica.
// `drop` (the trainer's third policy) is not shown: it never forms this batch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>

#include "checks.h"
#include "commands.h"
#include "host_memory.h"
#include "lockstep/comm/threads.h"
#include "lockstep/ddp/reducer.h"
#include "lockstep/nn/loss.h"
#include "lockstep/train/trainer.h"

namespace lockstep::cli {
namespace {

struct DemoFlags {
  std::string data_dir = data::default_data_dir().string();
  std::uint64_t seed = 0;
};

constexpr int kReplicas = 8;
constexpr std::int64_t kShard = 32, kShort = 11;

// The mean gradient of `model` over `rows` samples starting at sample
// `first`, the last `rows - real` of them padding (zeros, masked out).
std::vector<float> shard_gradient(nn::Model& model, const data::Dataset& d, std::int64_t first,
                                  std::int64_t real, std::int64_t rows) {
  const std::int64_t f = d.features, classes = d.num_classes;
  std::vector<float> x(static_cast<std::size_t>(rows * f), 0.0f);
  std::vector<std::int32_t> y(static_cast<std::size_t>(rows), 0);
  for (std::int64_t i = 0; i < real; ++i) {
    std::copy_n(d.input(first + i).data(), f, &x[i * f]);
    y[i] = d.labels[first + i];
  }
  std::vector<float> dlogits(static_cast<std::size_t>(rows * classes), 0.0f);
  auto logits = model.forward(x, rows);
  nn::softmax_cross_entropy(logits.data(), y.data(), real, classes, dlogits.data(), 1.0f / float(real));
  model.backward(dlogits, rows);
  auto g = model.grads();
  return {g.begin(), g.end()};
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

int run_demo_ragged(const DemoFlags& flags) {
  const auto data = load_data(flags.data_dir);
  const auto& d = data.train;
  train::TrainConfig c;
  c.seed = flags.seed;
  const std::int64_t global = kShard * (kReplicas - 1) + kShort;  // 235
  const std::int64_t equal_global = kShard * kReplicas;              // 256
  if (d.size < equal_global) {
    throw InvalidArgument("demo ragged takes one global batch of " + std::to_string(equal_global) +
                          " training samples, and " + flags.data_dir + " has " + std::to_string(d.size) +
                          "; give --data a larger set.");
  }
  auto counts = [](int r) { return r == kReplicas - 1 ? kShort : kShard; };

  auto model = train::make_model(c, d.features, d.num_classes);
  model->init(c.seed);
  const auto full = shard_gradient(*model, d, 0, global, global);
  // The errors below are relative to the full-batch gradient: with one class
  // (a softmax over one output) it is zero, and they would print as NaN.
  if (std::all_of(full.begin(), full.end(), [](float v) { return v == 0.0f; })) {
    throw InvalidArgument("the full-batch gradient of " + flags.data_dir + "'s first " + std::to_string(global) +
                          " samples is zero (its labels give " + std::to_string(d.num_classes) +
                          " class(es)), so there is no error to show; give --data a set with 2 or more classes.");
  }

  // Equal shards: the plain average of the eight means against all 256.
  // The ragged cut's first seven shards are the same samples, so their
  // gradients are kept for it; only the short shard is new.
  const auto full_equal = shard_gradient(*model, d, 0, equal_global, equal_global);
  std::vector<std::vector<float>> local(kReplicas);
  std::vector<float> equal(full_equal.size(), 0.0f);
  for (int r = 0; r < kReplicas; ++r) {
    local[r] = shard_gradient(*model, d, r * kShard, kShard, kShard);
    for (std::size_t i = 0; i < equal.size(); ++i) equal[i] += local[r][i] / kReplicas;
  }

  local[kReplicas - 1] = shard_gradient(*model, d, (kReplicas - 1) * kShard, kShort, kShort);
  std::vector<float> plain(full.size(), 0.0f);
  for (int r = 0; r < kReplicas; ++r)
    for (std::size_t i = 0; i < plain.size(); ++i) plain[i] += local[r][i] / kReplicas;

  // The reducer, for real: eight replicas on threads, each with its own copy.
  auto reduce = [&](bool pad) {
    std::vector<std::vector<float>> grads(kReplicas);
    auto comms = comm::make_thread_group({.world_size = kReplicas});
    std::vector<std::size_t> numels;
    for (const auto& t : model->layout().tensors()) numels.push_back(t.numel);
    std::vector<std::jthread> threads;
    std::vector<std::exception_ptr> errors(kReplicas);
    for (int r = 0; r < kReplicas; ++r) {
      threads.emplace_back([&, r] {
        try {
          auto replica = train::make_model(c, d.features, d.num_classes);
          replica->init(c.seed);
          grads[r] = pad ? shard_gradient(*replica, d, r * kShard, counts(r), kShard) : local[r];
          ddp::Reducer reducer(*comms[r], grads[r], numels);
          reducer.begin_step(counts(r), global);
          for (std::size_t t = numels.size(); t-- > 0;) reducer.mark_ready(t);
          reducer.finish_step();
        } catch (...) {
          errors[r] = std::current_exception();
          comms[r]->abort("demo replica failed");
        }
      });
    }
    threads.clear();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    return grads[0];
  };
  const auto weighted = reduce(false);
  const auto padded = reduce(true);

  std::printf(
      "Each replica's gradient is the mean over its own shard, compared below with the gradient of one model "
      "over the whole global batch (relative L2 error), on %s.\n"
      "Equal shards: one global batch of %lld samples, %d replicas x %lld.\n"
      "  equal     average of the %d replicas' means            %.3e   exact up to float rounding: a mean of "
      "equal-sized means is the mean of the whole\n"
      "Ragged shards: one global batch of %lld samples, cut as the card cuts it: %d replicas x %lld and one x %lld.\n",
      flags.data_dir.c_str(), (long long)equal_global, kReplicas, (long long)kShard, kReplicas,
      relative_error(equal, full_equal), (long long)global, kReplicas - 1, (long long)kShard, (long long)kShort);
  // Against the true mean (each sample 1/global), the plain average gives a
  // sample of the short shard 1/(N x short) and any other 1/(N x shard).
  const double n = kReplicas;
  std::printf(
      "  plain     average of the %d replicas' means            %.3e   wrong: each of the %lld samples "
      "weighs %lld/%lld = %.2fx its share, each other sample %lld/%lld = %.2fx\n",
      kReplicas, relative_error(plain, full), (long long)kShort, (long long)global,
      (long long)(kReplicas * kShort), double(global) / (n * double(kShort)), (long long)global,
      (long long)(kReplicas * kShard), double(global) / (n * double(kShard)));
  std::printf("  weighted  reducer, each replica x N*local/global       %.3e   exact up to float rounding\n",
              relative_error(weighted, full));
  std::printf(
      "  pad       shards padded to %lld, padding masked, weighted %.3e   exact, %lld padded rows computed\n",
      (long long)kShard, relative_error(padded, full), (long long)(kShard - kShort));
  std::printf("lockstep train uses weighted by default (--ragged weighted|drop|pad).\n");
  return 0;
}

}  // namespace

Action add_demo_command(CLI::App& app) {
  CLI::App* demo = app.add_subcommand("demo", "Small demonstrations of the card's claims on real data");
  demo->require_subcommand(1);
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* ragged = demo->add_subcommand(
      "ragged",
      "Ragged shards (7 x 32 + 1 x 11): a plain mean of means is wrong, weighting by count is exact");
  ragged->option_defaults()->always_capture_default();
  ragged->add_option("--data", flags->data_dir, "Directory of an IDX data set")->check(not_empty());
  ragged->add_option("--seed", flags->seed, "Seed of the model's weights")
      ->transform(unsigned_number_upto(std::numeric_limits<std::uint64_t>::max()));
  return [flags] { return run_demo_ragged(*flags); };
}

}  // namespace lockstep::cli
