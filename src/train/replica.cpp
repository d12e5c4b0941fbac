// One replica: the card's step, in order.
//   1. take this replica's shard of the global batch (no communication);
//   2. forward and backward through its own weights (activations stay here);
//   3. average_gradients: the one all-reduce of the step;
//   4. the optimizer step, identical everywhere.
#include "replica.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "lockstep/ddp/gradient_sync.h"
#include "lockstep/nn/loss.h"

namespace lockstep::train::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Sum-all-reduces a few tallies (loss sums, sample and correct counts). They
// travel as float: counts stay exact below 2^24, and a logged loss needs no
// more than float's 7 digits.
void allreduce_tallies(comm::Communicator& comm, std::span<double> values) {
  std::vector<float> buf(values.begin(), values.end());
  comm::allreduce(comm, buf, {.op = comm::ReduceOp::Sum});
  std::copy(buf.begin(), buf.end(), values.begin());
}

// Accuracy on the test set, split across replicas; every replica gets it.
double evaluate(comm::Communicator& comm, nn::Model& model, const data::Dataset& test) {
  const std::int64_t n = comm.size(), r = comm.rank();
  const std::int64_t begin = test.size * r / n, end = test.size * (r + 1) / n;
  const std::int64_t chunk = 256, features = test.features;
  double tally[2] = {0, 0};  // correct, count
  for (std::int64_t i = begin; i < end; i += chunk) {
    const std::int64_t b = std::min(chunk, end - i);
    auto x = std::span<const float>(test.inputs).subspan(i * features, b * features);
    auto logits = model.forward(x, b);
    auto s = nn::softmax_cross_entropy(logits.data(), test.labels.data() + i, b, model.out_features(),
                                       nullptr, 0.0f);
    tally[0] += double(s.correct);
    tally[1] += double(b);
  }
  allreduce_tallies(comm, tally);
  return tally[0] / tally[1];
}

}  // namespace

ReplicaOutput run_replica(const Shared& s, comm::Communicator& comm) {
  const TrainConfig& c = s.config;
  const data::Dataset& train = s.data.train;
  const int rank = comm.rank();
  ReplicaOutput out;

  auto model = make_model(c, train.features, train.num_classes);
  auto optimizer = make_optimizer(c, model->layout().numel());
  auto params = model->params();
  auto grads = model->grads();

  // Weights: made once on rank 0, broadcast once, never exchanged again.
  if (rank == 0) {
    if (c.initial_params) {
      std::memcpy(params.data(), c.initial_params->data(), params.size_bytes());
    } else {
      model->init(c.seed);
    }
  }
  comm::broadcast(comm, params, 0);
  out.traffic.init_broadcast = comm.stats().bytes_sent;

  const std::int64_t features = train.features, classes = train.num_classes;
  std::vector<float> x(static_cast<std::size_t>(c.micro_batch * features + features));
  std::vector<std::int32_t> y(static_cast<std::size_t>(c.micro_batch + 1));
  std::vector<float> dlogits(static_cast<std::size_t>((c.micro_batch + 1) * classes));
  std::vector<std::int64_t> order;
  double window[2] = {0, 0};  // loss sum, samples since the last report
  auto start = Clock::now();
  double eval_seconds = 0;
  std::int64_t samples = 0;  // global samples processed by the group since `start`

  for (std::int64_t step = 0; step < s.total_steps; ++step) {
    if (step == s.warmup_steps && step > 0) {  // restart the clock after warm-up
      start = Clock::now();
      samples = 0;
      eval_seconds = 0;
    }
    const std::int64_t epoch = step / s.sampler.steps_per_epoch();
    const std::int64_t in_epoch = step % s.sampler.steps_per_epoch();
    if (in_epoch == 0) order = s.sampler.epoch_order(epoch);
    const ddp::Shard shard = s.sampler.shard(in_epoch, rank);
    const std::int64_t b = shard.size();

    for (std::int64_t i = 0; i < b; ++i) {  // gather this replica's own samples
      const std::int64_t idx = order[static_cast<std::size_t>(shard.begin + i)];
      std::memcpy(&x[i * features], train.input(idx).data(), features * sizeof(float));
      y[i] = train.labels[idx];
    }
    auto logits = model->forward(std::span<const float>(x.data(), b * features), b);
    auto loss = nn::softmax_cross_entropy(logits.data(), y.data(), b, classes, dlogits.data(),
                                          b > 0 ? 1.0f / float(b) : 0.0f);
    // Accumulates into gradients the previous optimizer step left at zero.
    model->backward(std::span<const float>(dlogits.data(), b * classes), b, /*accumulate=*/true);

    const auto before = comm.stats().bytes_sent;
    ddp::average_gradients(comm, grads, b, shard.global_count, c.algorithm);
    out.traffic.gradients += comm.stats().bytes_sent - before;

    const float lr = optim::learning_rate(c.schedule, c.lr, step, s.total_steps);
    optimizer->step_and_zero_grads(params, grads, lr);
    if (s.hooks.on_replica_step) s.hooks.on_replica_step(rank, step, params, optimizer->state());

    window[0] += loss.loss_sum;
    window[1] += double(b);
    samples += shard.global_count;
    const bool epoch_end = in_epoch == s.sampler.steps_per_epoch() - 1 || step == s.total_steps - 1;
    if ((step + 1) % c.log_every == 0 || epoch_end) {
      const auto before_ctl = comm.stats().bytes_sent;
      allreduce_tallies(comm, window);
      Progress p{epoch, step + 1, s.total_steps, window[0] / window[1], 0, lr, std::nullopt};
      out.final_loss = p.loss;
      window[0] = window[1] = 0;
      if (epoch_end && c.evaluate) {
        const auto t0 = Clock::now();
        p.test_accuracy = evaluate(comm, *model, s.data.test);
        eval_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
        out.epoch_test_accuracy.push_back(*p.test_accuracy);
      }
      out.traffic.control += comm.stats().bytes_sent - before_ctl;
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count() - eval_seconds;
      p.samples_per_s = double(samples) / elapsed;
      if (rank == 0 && s.hooks.on_progress) s.hooks.on_progress(p);
    }
    if (epoch_end) out.epochs_run = epoch + 1;
  }
  out.train_seconds = std::chrono::duration<double>(Clock::now() - start).count() - eval_seconds;
  const auto st = comm.stats();
  out.traffic.unaccounted =
      st.bytes_sent - out.traffic.init_broadcast - out.traffic.gradients - out.traffic.control;
  if (rank == 0) out.params.assign(params.begin(), params.end());
  return out;
}

}  // namespace lockstep::train::detail
