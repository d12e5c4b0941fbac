// The reducer's step, after PyTorch's c10d Reducer (behaviour, not code):
//   - each bucket keeps a countdown of tensors not yet ready;
//   - mark_ready(t) decrements t's bucket; at zero the bucket is ready;
//   - one communication thread all-reduces ready buckets strictly in launch
//     order 0, 1, 2, ... (every rank issues the same collectives in the same
//     order, whatever order its own gradients became ready in);
//   - finish_step() waits only for the buckets still in flight.
// Bytes on the wire per step: the sum over buckets of one all-reduce each,
// ~2P(N-1)/N with the ring, whatever the bucket sizes (bf16: half that).
//
// Note [Ragged weighting]: replica r's gradient is the mean over its own
// local_r samples. Scaling it by N * local_r / global before the Mean
// all-reduce makes the result sum_r local_r * g_r / global: the exact mean
// over all samples, not a mean of means.
//
// Note [Error feedback]: with bf16 on the wire a replica sends q = bf16(g + e)
// and keeps e = (g + e) - q for the next step, so what rounding took from one
// step is given back in the next instead of being lost.
#include "lockstep/ddp/reducer.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "lockstep/comm/bf16.h"
#include "lockstep/error.h"
#include "ragged_weight.h"

namespace lockstep::ddp {
namespace {

using Clock = std::chrono::steady_clock;

std::size_t mib_to_bytes(double mb, const char* what) {
  if (!(mb >= 0) || mb > 1e6) {
    throw InvalidArgument(std::string(what) + " must be between 0 and 1e6 MiB, got " + std::to_string(mb));
  }
  return static_cast<std::size_t>(mb * double(1 << 20));
}

// bucket_mb in bytes. One under a byte truncated to 0, which means one bucket
// after backward: asked for the smallest buckets, the caller got no overlap
// at all. (first_bucket_mb needs no such check: a first bucket of 0 bytes
// holds one tensor, as one of a byte does.)
std::size_t bucket_bytes(double mb) {
  const std::size_t bytes = mib_to_bytes(mb, "bucket_mb (--bucket-mb)");
  if (bytes == 0 && mb > 0) {
    char text[224];
    std::snprintf(text, sizeof text,
                  "bucket_mb (--bucket-mb) of %g MiB is under one byte, which would read as 0, one bucket "
                  "after backward; give 0 for that, or at least 1e-6 MiB.",
                  mb);
    throw InvalidArgument(text);
  }
  return bytes;
}

// FNV-1a over the bucket layout: what every rank must agree on.
std::uint64_t layout_hash(const std::vector<Bucket>& buckets) {
  std::uint64_t h = 14695981039346656037ull;
  auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  mix(buckets.size());
  for (const auto& b : buckets) {
    mix(b.offset);
    mix(b.numel);
    for (auto t : b.tensors) mix(t);
  }
  return h;
}

// Note [Layout check]: every rank gathers every rank's layout hash (as four
// 16-bit pieces, exact in float) and compares it with rank 0's. All ranks see
// the same gathered values, so all of them throw, or none does.
void check_same_layout(comm::Communicator& comm, const std::vector<Bucket>& buckets) {
  const std::uint64_t h = layout_hash(buckets);
  float mine[4];
  for (int i = 0; i < 4; ++i) mine[i] = float((h >> (16 * i)) & 0xffff);
  std::vector<float> all(4 * static_cast<std::size_t>(comm.size()));
  comm::all_gather(comm, mine, all);
  for (int r = 1; r < comm.size(); ++r) {
    if (std::memcmp(&all[4 * r], &all[0], 4 * sizeof(float)) != 0) {
      throw InvalidArgument("the gradient bucket layout of rank " + std::to_string(r) +
                            " differs from rank 0's; every replica must build the same model with the same "
                            "bucket_mb and first_bucket_mb (--bucket-mb, --first-bucket-mb)");
    }
  }
}

}  // namespace

struct Reducer::State {
  comm::Communicator& comm;
  std::span<float> grads;
  ReducerOptions options;
  std::vector<Bucket> buckets;
  std::vector<std::size_t> bucket_of;  // tensor -> bucket

  // Owner thread only.
  std::vector<std::size_t> countdown;  // per bucket: tensors not yet ready
  std::vector<char> announced;         // per tensor, this step

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  bool in_step = false;
  bool stop = false;
  std::vector<char> ready;  // per bucket
  std::size_t next = 0;     // the bucket the communication thread does next
  bool busy = false;        // the communication thread is inside a bucket's collective
  std::exception_ptr error;
  float weight = 1;
  std::uint64_t global_count = 0;  // checked with every bucket's fingerprint (AllreduceOptions::global_batch)
  StepTiming timing;

  // Communication thread only (between begin_step and finish_step).
  std::vector<float> residual;      // Note [Error feedback]
  std::vector<std::uint16_t> wire;  // bf16 copy of one bucket
  std::thread thread;

  State(comm::Communicator& c, std::span<float> g) : comm(c), grads(g) {}

  void reduce(const Bucket& b, float w, std::uint64_t global_batch) {
    auto g = grads.subspan(b.offset, b.numel);
    if (w != 1.0f)
      for (float& v : g) v *= w;
    if (options.shard) {
      comm::reduce_scatter_in_place(
          comm, g, {.op = comm::ReduceOp::Mean, .algorithm = options.algorithm, .global_batch = global_batch});
      return;
    }
    if (options.compression == Compression::None) {
      comm::allreduce(comm, g, {.op = comm::ReduceOp::Mean, .algorithm = options.algorithm, .global_batch = global_batch});
      return;
    }
    auto e = std::span<float>(residual).subspan(b.offset, b.numel);
    auto q = std::span<std::uint16_t>(wire).first(b.numel);
    for (std::size_t i = 0; i < b.numel; ++i) {
      const float v = g[i] + e[i];
      q[i] = comm::to_bf16(v);
      e[i] = std::isfinite(v) ? v - comm::from_bf16(q[i]) : 0.0f;  // a NaN must not outlive its step
    }
    comm::allreduce_bf16(comm, q, comm::ReduceOp::Mean, global_batch);
    comm::from_bf16(q, g);
  }

  void run() {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || (in_step && next < buckets.size() && ready[next]); });
      if (stop) return;
      const std::size_t k = next;
      const float w = weight;
      const std::uint64_t batch = global_count;
      busy = true;
      lock.unlock();
      const auto start = Clock::now();
      const comm::CommStats before = comm.stats();
      std::exception_ptr failed;
      try {
        reduce(buckets[k], w, batch);
      } catch (...) {
        failed = std::current_exception();
      }
      const auto end = Clock::now();
      const comm::CommStats after = comm.stats();
      lock.lock();
      busy = false;
      timing.buckets[k].start = start;
      timing.buckets[k].end = end;
      timing.buckets[k].bytes_sent = after.bytes_sent - before.bytes_sent;
      timing.buckets[k].messages_sent = after.messages_sent - before.messages_sent;
      if (failed) {
        error = failed;
        next = buckets.size();  // give up the step; finish_step rethrows
      } else {
        ++next;
      }
      cv.notify_all();
    }
  }

  // A step this rank cannot finish (a misuse found in finish_step): aborts
  // the group, whose other ranks wait in this step's collectives, ends the
  // step once the communication thread has left its collective (the abort
  // fails it at once), and throws InvalidArgument(what). The next step's
  // first collective meets the group's error, as after any failed step. If
  // the thread is still inside its collective after the timeout, the step is
  // left as it is (the thread writes its end when it returns).
  [[noreturn]] void refuse_step(const std::string& what) {
    comm.abort("rank " + std::to_string(comm.rank()) + ": " + what);
    std::unique_lock lock(mu);
    if (cv.wait_until(lock, comm::deadline_after(comm.timeout()), [&] { return !busy; })) {
      next = buckets.size();
      in_step = false;
    }
    throw InvalidArgument(what);
  }
};

Reducer::Reducer(comm::Communicator& comm, std::span<float> grads, std::span<const std::size_t> tensor_numels,
                 const ReducerOptions& options)
    : state_(std::make_unique<State>(comm, grads)) {
  State& s = *state_;
  s.options = options;
  try {  // this rank's own checks: refused, it would leave the others waiting in check_same_layout
    std::size_t total = 0;
    for (auto n : tensor_numels) total += n;
    if (total != grads.size()) {
      throw InvalidArgument("the reducer's tensors hold " + std::to_string(total) +
                            " floats but the gradient span " + std::to_string(grads.size()));
    }
    s.buckets = assign_buckets(tensor_numels, mib_to_bytes(options.first_bucket_mb, "first_bucket_mb (--first-bucket-mb)"),
                               bucket_bytes(options.bucket_mb));
    comm::check_algorithm(comm, options.algorithm);
    if (options.compression == Compression::Bf16 && options.algorithm != comm::Algorithm::Auto &&
        options.algorithm != comm::Algorithm::Ring) {
      throw InvalidArgument(std::string("bf16 compression all-reduces with its own ring, not ") +
                            comm::to_string(options.algorithm) + "; use algorithm auto or ring with it.");
    }
    if (options.shard && options.compression != Compression::None) {
      throw InvalidArgument("a sharded reducer (ZeRO-1) reduce-scatters in float32; bf16 compression cannot be "
                            "combined with it");
    }
    if (options.shard && options.algorithm != comm::Algorithm::Auto && options.algorithm != comm::Algorithm::Ring &&
        options.algorithm != comm::Algorithm::SharedMemory) {
      throw InvalidArgument(std::string("a sharded reducer (ZeRO-1) reduce-scatters with the ring or shared memory, "
                                        "not ") +
                            comm::to_string(options.algorithm) + "; use algorithm auto or ring with it.");
    }
  } catch (const Error& e) {
    comm::refuse_call(comm, e.what());  // the others are waiting in check_same_layout
  }
  s.bucket_of.resize(tensor_numels.size());
  std::size_t widest = 0;
  for (std::size_t k = 0; k < s.buckets.size(); ++k) {
    for (auto t : s.buckets[k].tensors) s.bucket_of[t] = k;
    widest = std::max(widest, s.buckets[k].numel);
  }
  if (options.compression == Compression::Bf16) {
    s.residual.assign(grads.size(), 0.0f);
    s.wire.resize(widest);
  }
  check_same_layout(comm, s.buckets);
  s.countdown.resize(s.buckets.size());
  s.announced.resize(tensor_numels.size());
  s.ready.resize(s.buckets.size());
  s.timing.buckets.resize(s.buckets.size());
  if (options.overlap) s.thread = std::thread([&s] { s.run(); });
}

Reducer::~Reducer() {
  State& s = *state_;
  {
    std::lock_guard lock(s.mu);
    // Mid-step: the other ranks may be waiting in this step's collectives.
    if (s.in_step && s.next < s.buckets.size() && !s.comm.aborted()) {
      s.comm.abort("rank " + std::to_string(s.comm.rank()) + " left a step with gradient buckets in flight");
    }
    s.stop = true;
  }
  s.cv.notify_all();
  if (s.thread.joinable()) s.thread.join();
}

const std::vector<Bucket>& Reducer::buckets() const {
  return state_->buckets;
}

void Reducer::begin_step(std::int64_t local_count, std::int64_t global_count) {
  State& s = *state_;
  if (!(global_count > 0 && local_count >= 0 && local_count <= global_count)) {
    comm::refuse_call(s.comm, "Reducer::begin_step(" + std::to_string(local_count) + ", " + std::to_string(global_count) +
                       "): the local sample count must be in [0, global count] and the global count positive");
  }
  if (s.in_step) comm::refuse_call(s.comm, "Reducer::begin_step() called again before finish_step() ended the step");
  const std::int64_t n = s.comm.size();
  for (std::size_t k = 0; k < s.buckets.size(); ++k) s.countdown[k] = s.buckets[k].tensors.size();
  std::fill(s.announced.begin(), s.announced.end(), 0);
  std::lock_guard lock(s.mu);
  s.weight = detail::ragged_weight(local_count, n, global_count);
  s.global_count = static_cast<std::uint64_t>(global_count);
  std::fill(s.ready.begin(), s.ready.end(), 0);
  s.next = 0;
  s.error = nullptr;
  s.in_step = true;
}

void Reducer::gather(std::span<float> params) {
  State& s = *state_;
  LOCKSTEP_REQUIRE(s.options.shard, "Reducer::gather() on a reducer without options.shard: its replicas hold "
                                     "whole reduced gradients and update every weight themselves, so there is "
                                     "nothing to gather");
  LOCKSTEP_REQUIRE(!s.in_step, "Reducer::gather() inside a step; call it after finish_step()");
  LOCKSTEP_REQUIRE(params.size() == s.grads.size(), "Reducer::gather(): the span holds " +
                                                        std::to_string(params.size()) + " floats, the gradients " +
                                                        std::to_string(s.grads.size()));
  for (const auto& b : s.buckets)
    comm::all_gather_in_place(s.comm, params.subspan(b.offset, b.numel), {.algorithm = s.options.algorithm});
}

std::vector<GradRange> owned_ranges(const std::vector<Bucket>& buckets, int rank, int world_size) {
  std::vector<GradRange> ranges;
  for (const auto& b : buckets) {
    const auto [begin, end] = comm::shard_range(b.numel, rank, world_size);
    if (end > begin) ranges.push_back({b.offset + begin, end - begin});
  }
  std::sort(ranges.begin(), ranges.end(), [](const GradRange& a, const GradRange& b) { return a.offset < b.offset; });
  return ranges;
}

void Reducer::discard_error_feedback() {
  State& s = *state_;
  LOCKSTEP_REQUIRE(!s.in_step, "Reducer::discard_error_feedback() inside a step; call it after finish_step()");
  std::fill(s.residual.begin(), s.residual.end(), 0.0f);
}

std::span<const float> Reducer::error_feedback() const {
  const State& s = *state_;
  LOCKSTEP_REQUIRE(!s.in_step, "Reducer::error_feedback() inside a step; call it after finish_step()");
  return s.residual;
}

void Reducer::restore_error_feedback(std::span<const float> error) {
  State& s = *state_;
  LOCKSTEP_REQUIRE(!s.in_step, "Reducer::restore_error_feedback() inside a step; call it before begin_step()");
  if (error.size() != s.residual.size()) {
    throw InvalidArgument("Reducer::restore_error_feedback: " + std::to_string(error.size()) + " values, but this "
                          "reducer keeps " + std::to_string(s.residual.size()) +
                          (s.residual.empty() ? " (no --compress bf16)" : " (one per gradient value)"));
  }
  std::copy(error.begin(), error.end(), s.residual.begin());
}

void Reducer::mark_ready(std::size_t tensor) {
  State& s = *state_;
  LOCKSTEP_REQUIRE(s.in_step, "Reducer::mark_ready() outside a step; call begin_step() first");
  LOCKSTEP_REQUIRE(tensor < s.announced.size(), "Reducer::mark_ready(" + std::to_string(tensor) +
                                                    "): there are " + std::to_string(s.announced.size()) +
                                                    " tensors");
  LOCKSTEP_REQUIRE(!s.announced[tensor],
                   "Reducer::mark_ready(" + std::to_string(tensor) + "): the tensor was already marked this step");
  s.announced[tensor] = 1;
  const std::size_t k = s.bucket_of[tensor];
  if (--s.countdown[k] > 0) return;
  {
    std::lock_guard lock(s.mu);
    s.ready[k] = 1;
    s.timing.buckets[k].ready = Clock::now();
  }
  if (s.options.overlap) s.cv.notify_all();
}

const StepTiming& Reducer::finish_step() {
  State& s = *state_;
  LOCKSTEP_REQUIRE(s.in_step, "Reducer::finish_step() outside a step; call begin_step() first");
  for (std::size_t t = 0; t < s.announced.size(); ++t) {
    if (!s.announced[t]) {
      s.refuse_step("Reducer::finish_step(): tensor " + std::to_string(t) +
                    " was never marked ready this step; call mark_ready() for every tensor");
    }
  }
  if (!s.options.overlap) {  // every bucket, in order, here and now
    s.timing.wait_start = Clock::now();
    try {
      for (std::size_t k = 0; k < s.buckets.size(); ++k) {
        auto& t = s.timing.buckets[k];
        const comm::CommStats before = s.comm.stats();
        t.start = Clock::now();
        s.next = k;
        s.reduce(s.buckets[k], s.weight, s.global_count);
        t.end = Clock::now();
        const comm::CommStats after = s.comm.stats();
        t.bytes_sent = after.bytes_sent - before.bytes_sent;
        t.messages_sent = after.messages_sent - before.messages_sent;
      }
    } catch (...) {  // the step ends here, as with overlap: the next call meets the group's own error
      s.next = s.buckets.size();
      s.in_step = false;
      throw;
    }
    s.next = s.buckets.size();
    s.in_step = false;
    s.timing.wait_end = Clock::now();
    return s.timing;
  }
  std::unique_lock lock(s.mu);
  s.timing.wait_start = Clock::now();
  // The collectives have their own timeouts, one per wait, and a bucket's
  // all-reduce waits once per round: over a slow link it may rightly take
  // several timeouts in all (2(N-1) rounds of the ring). So this bound only
  // catches a bug, the communication thread idle with buckets left: it
  // starts again while the thread is inside a collective or has finished a
  // bucket since the last look. (It used to bound the whole wait, and failed
  // healthy steps: 8 replicas on a 50 ms link with --timeout 0.2.)
  const auto rounds = static_cast<comm::Duration::rep>(2 + s.buckets.size());
  const auto guard = s.comm.timeout() >= comm::Duration::max() / rounds ? comm::Duration::max()
                                                                       : s.comm.timeout() * rounds;
  std::size_t seen = s.next;
  auto deadline = comm::deadline_after(guard);
  while (s.next != s.buckets.size()) {
    if (s.cv.wait_until(lock, deadline) == std::cv_status::no_timeout || s.next == s.buckets.size()) continue;
    if (s.busy || s.next != seen) {  // still working: the collective's own timeouts bound it
      seen = s.next;
      deadline = comm::deadline_after(guard);
      continue;
    }
    const std::string msg = "rank " + std::to_string(s.comm.rank()) + ": gradient bucket " +
                            std::to_string(s.next) + " was not started within " +
                            std::to_string(guard.count()) + " ms";
    s.comm.abort(msg);
    throw TimeoutError(msg);
  }
  s.timing.wait_end = Clock::now();
  s.in_step = false;
  if (s.error) std::rethrow_exception(s.error);
  return s.timing;
}

}  // namespace lockstep::ddp
