// The guards of the step loop (guards.h). Every decision below is taken on
// values that every replica holds identically after a collective (gathered
// digests, an all-reduced flag row), never on a local value alone: that is
// what makes the replicas take the same branch (Note [Symmetric decisions]).
#include "guards.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "lockstep/version.h"

namespace lockstep::train::detail {
namespace {

std::string exact(double v) {  // hexadecimal float: every bit of the value
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

std::string layout_text(const nn::Layout& layout) {
  std::string s;
  for (const auto& t : layout.tensors()) {
    s += t.name;
    s += ':';
    for (auto d : t.shape) {
      s += ' ';
      s += std::to_string(d);
    }
    s += '\n';
  }
  return s;
}

const char* kind_name(Fault::Kind k) {
  switch (k) {
    case Fault::Kind::BitFlip:
      return "bitflip";
    case Fault::Kind::BufferBitFlip:
      return "bitflip-buffer";
    case Fault::Kind::NaN:
      return "nan";
    case Fault::Kind::Throw:
      return "throw";
    case Fault::Kind::SameSeed:
      return "same-seed";
  }
  return "?";
}

}  // namespace

std::vector<ddp::Bucket> planned_buckets(const TrainConfig& c, const nn::Layout& layout) {
  std::vector<std::size_t> numels;
  for (const auto& t : layout.tensors()) numels.push_back(t.numel);
  auto bytes = [](double mb) { return static_cast<std::size_t>(mb * double(1 << 20)); };  // as the reducer
  return ddp::assign_buckets(numels, bytes(c.first_bucket_mb), bytes(c.bucket_mb));
}

std::uint64_t inputs_digest(const data::ImageClassificationData& data) {
  return ddp::digest(std::as_bytes(std::span(data.train.inputs)));
}

std::vector<ddp::HandshakeField> handshake_fields(const TrainConfig& c,
                                                  const data::ImageClassificationData& data,
                                                  std::int64_t total_steps, const nn::Model& model,
                                                  std::span<const ddp::Bucket> buckets,
                                                  std::uint64_t inputs_digest) {
  std::string labels_digest = std::to_string(ddp::digest(std::as_bytes(std::span(data.train.labels))));
  std::vector<std::string> tensor_names;
  for (const auto& t : model.layout().tensors()) tensor_names.push_back(t.name);
  std::string faults;
  for (const auto& f : c.inject)
    faults +=
        std::string(kind_name(f.kind)) + "@" + std::to_string(f.step) + ":" + std::to_string(f.rank) + " ";
  std::vector<ddp::HandshakeField> fields = {
      {"build version", lockstep::version()},
      {"world size (--replicas)", std::to_string(c.replicas)},
      {"--seed", std::to_string(c.seed)},
      {"--optimizer", c.optimizer},
      {"--lr", exact(c.lr)},
      {"--schedule", c.schedule == optim::Schedule::Cosine ? "cosine" : "constant"},
      {"--lr-warmup", std::to_string(c.lr_warmup)},
      {"--clip-grad-norm", c.clip_grad_norm > 0 ? exact(c.clip_grad_norm) : "off"},
      {"--momentum", exact(c.momentum)},
      {"--weight-decay", exact(c.weight_decay)},
      {"--nesterov", c.nesterov ? "on" : "off"},
      {"--steps/--epochs", std::to_string(total_steps)},
      {"--micro-batch", std::to_string(c.micro_batch)},
      {"--accumulate", std::to_string(c.accumulate)},
      {"--shuffle", c.shuffle ? "on" : "off"},
      {"--ragged", to_string(c.ragged)},
      {"--deterministic (--atom)", c.deterministic ? "on, atom " + std::to_string(c.atom) : "off"},
      {"--bn-stats", c.bn_stats == BnStats::Sync ? "sync" : "local"},
      {"data set (size, features, classes, labels)",
       std::to_string(data.train.size) + " " + std::to_string(data.train.features) + " " +
           std::to_string(data.train.num_classes) + " " + labels_digest},
      {"training inputs (the image files, --normalize)", std::to_string(inputs_digest)},
      {"--algorithm", comm::to_string(c.algorithm)},
      {"--compress", c.compression == ddp::Compression::Bf16 ? "bf16" : "none"},
      {"--zero", std::to_string(c.zero)},
      {"model (parameter names, shapes and order)", model.describe() + "\n" + layout_text(model.layout())},
      {"model buffers", layout_text(model.buffer_layout())},
      {"bucket layout (--first-bucket-mb, --bucket-mb)",
       ddp::describe_buckets({buckets.begin(), buckets.end()}, tensor_names)},
      // Each progress line and each epoch's test accuracy is a collective.
      {"--log-every", std::to_string(c.log_every)},
      {"stop poll (TrainConfig::stop_poll_ms)", exact(c.stop_poll_ms)},
      {"test evaluation", c.evaluate ? "on" : "off"},
      {"--check-every", std::to_string(c.check_every)},
      {"--on-divergence", c.on_divergence == OnDivergence::Stop ? "stop" : "repair"},
      {"--max-skips", std::to_string(c.max_skips)},
      {"--inject", faults},
      {"--resume (the step it goes on from, the optimizer's updates)",
       std::to_string(c.start_step) + ", " + std::to_string(c.initial_optimizer_steps) + ", " +
           std::to_string(c.initial_skips_in_a_row) + " skipped in a row"},
  };
  // A user's model (TrainConfig::model_factory) by its name too: its layers may be of its own, whose
  // describe() need not tell two apart. Built-in models have none: their checkpoints hold no such field.
  if (c.model_factory) fields.push_back({kUserModelNameField, c.model});
  return fields;
}

void verify_broadcast_weights(comm::Communicator& comm, const nn::Model& model) {
  std::vector<std::uint64_t> digests;
  const auto params = model.params();
  for (const auto& t : model.layout().tensors())
    digests.push_back(ddp::digest(params.subspan(t.offset, t.numel)));
  const auto m = ddp::compare_across_ranks(comm, digests);
  if (m.empty()) return;
  throw Error("the weights differ after the initial broadcast: " + model.layout().tensors()[m[0].field].name +
              " on " + ddp::describe_ranks(m[0].ranks) + "; the transport corrupted them, rerun.");
}

float overflow_limit(std::int64_t terms) {
  return std::numeric_limits<float>::max() / (2.0f * static_cast<float>(std::max<std::int64_t>(1, terms)));
}

bool has_nonfinite(std::span<const float> values, float limit) {
  // |v| > limit, NaN and infinities included: without the sign bit, a
  // float's bits order as its magnitude, and inf and NaN order above every
  // finite value. An integer test, so it vectorises.
  // At most FLT_MAX, so that infinities and NaN are always flagged (an
  // infinite or NaN limit means no limit but that).
  const float bound = std::isnan(limit) ? std::numeric_limits<float>::max()
                                        : std::min(std::fabs(limit), std::numeric_limits<float>::max());
  const std::uint32_t most = std::bit_cast<std::uint32_t>(bound);
  std::uint32_t bad = 0;
  for (float v : values) bad |= std::uint32_t((std::bit_cast<std::uint32_t>(v) & 0x7fffffffu) > most);
  return bad != 0;
}

void mark_nonfinite_sentinel(std::span<float> grads, bool local_nonfinite, std::span<const std::size_t> at) {
  if (!local_nonfinite || grads.empty()) return;
  if (at.empty()) grads[0] = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t i : at) grads[i] = std::numeric_limits<float>::quiet_NaN();
}

bool reduced_nonfinite_sentinel(std::span<const float> grads, std::size_t mine) {
  return mine < grads.size() && !std::isfinite(grads[mine]);
}

StateFingerprint::StateFingerprint(const nn::Layout& layout, const optim::Optimizer& optimizer,
                                   const nn::Layout& buffers, bool state_replicated) {
  for (const auto& t : layout.tensors()) {
    fields_.push_back({Source::Params, t.offset, t.numel});
    names_.push_back(t.name);
  }
  const auto slots = state_replicated ? optimizer.slot_names() : std::vector<std::string>{};
  for (std::size_t s = 0; s < slots.size(); ++s) {
    for (const auto& t : layout.tensors()) {  // slot s is laid out like the parameters, at s x P
      fields_.push_back({Source::State, s * layout.numel() + t.offset, t.numel});
      names_.push_back(t.name + " (optimizer " + slots[s] + ")");
    }
  }
  for (const auto& t : buffers.tensors()) {
    fields_.push_back({Source::Buffers, t.offset, t.numel});
    names_.push_back(t.name + " (buffer)");
  }
}

std::vector<std::uint64_t> StateFingerprint::digests(std::span<const float> params, std::span<const float> state,
                                                     std::span<const float> buffers) const {
  std::vector<std::uint64_t> digests;
  digests.reserve(fields_.size() + 2);
  for (const auto& f : fields_) {
    const auto from = f.source == Source::Params ? params : f.source == Source::State ? state : buffers;
    digests.push_back(ddp::digest(from.subspan(f.offset, f.numel)));
  }
  return digests;
}

Guards::Guards(const TrainConfig& c, const TrainHooks& hooks, comm::Communicator& comm,
               const nn::Model& model, const optim::Optimizer& optimizer)
    : c_(c),
      hooks_(hooks),
      comm_(comm),
      layout_(model.layout()),
      buffer_layout_(model.buffer_layout()),
      buffers_replicated_(c.bn_stats == BnStats::Sync || c.deterministic),
      state_replicated_(c.zero == 0 || comm.size() == 1),
      fingerprint_(model.layout(), optimizer, model.buffer_layout(), state_replicated_),
      consecutive_skips_(c.initial_skips_in_a_row) {}

void Guards::warn(const std::string& message) const {
  if (hooks_.on_warning) hooks_.on_warning(message);
}

bool Guards::injects(Fault::Kind kind, std::int64_t step) const {
  for (const auto& f : c_.inject)
    if (f.kind == kind && f.step == step && f.rank == comm_.rank()) return true;
  return false;
}

void Guards::maybe_throw(std::int64_t step) const {
  if (!injects(Fault::Kind::Throw, step)) return;
  throw Error("rank " + std::to_string(comm_.rank()) + ": injected failure at step " + std::to_string(step) +
              " (--inject throw@" + std::to_string(step) + ":" + std::to_string(comm_.rank()) + ").");
}

void Guards::maybe_flip_bit(std::int64_t step, std::span<float> params, std::span<float> buffers) const {
  const bool buffer = injects(Fault::Kind::BufferBitFlip, step);
  if (buffer && buffers.empty()) {
    throw InvalidArgument("--inject bitflip-buffer needs a model with buffers (batch norm).");
  }
  if (!buffer) {
    if (!injects(Fault::Kind::BitFlip, step) || params.empty()) return;
  } else {
    params = buffers;
  }
  const nn::Layout& layout = buffer ? buffer_layout_ : layout_;
  // The value in the middle of the arena; bit 22 (the mantissa's top bit):
  // the value changes by up to half and stays finite.
  const std::size_t i = params.size() / 2;
  params[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(params[i]) ^ (1u << 22));
  std::string tensor = "?";
  for (const auto& t : layout.tensors())
    if (i >= t.offset && i < t.offset + t.numel) tensor = t.name + "[" + std::to_string(i - t.offset) + "]";
  warn("rank " + std::to_string(comm_.rank()) + ": injected a bit flip in " + tensor + " after step " +
       std::to_string(step) + ".");
}

// Note [Symmetric decisions]: whether to skip is read from the all-reduced
// sentinel (Note [Non-finite sentinel], guards.h), which every replica holds
// bit for bit. Only then does each replica set its own entry of a row of N
// flags; an all-reduce (max) gives every replica the same row, naming the
// replicas of origin. The flag was computed on the local gradient before the
// all-reduce (replica.cpp scans each tensor before handing it to the
// reducer), so the origin is the replica whose own samples produced it, not
// every replica that received it through the mean.
//
// Note [Skips across a resume]: --max-skips counts the steps skipped in a
// row, and a run of them can span a checkpoint. A checkpoint keeps the count
// (Checkpoint::skips_in_a_row) and a resumed run counts on from it; started
// again at 0, a run resumed after the first of two skips (--max-skips 2)
// trained on where the unbroken run had stopped at the second, and a job that
// lockstep launch --max-restarts restarted after such a stop could go on
// past the limit.
bool Guards::skip_step(std::int64_t step, bool reduced_nonfinite, bool local_nonfinite, std::span<float> grads,
                       ReplicaOutput& out) {
  if (!reduced_nonfinite) {
    consecutive_skips_ = 0;
    return false;
  }
  const auto before = comm_.stats().bytes_sent;
  std::vector<float> flags(static_cast<std::size_t>(comm_.size()), 0.0f);
  flags[static_cast<std::size_t>(comm_.rank())] = local_nonfinite ? 1.0f : 0.0f;
  comm::allreduce(comm_, flags, {.op = comm::ReduceOp::Max});
  out.traffic.checks += comm_.stats().bytes_sent - before;
  std::vector<int> origins;
  for (std::size_t r = 0; r < flags.size(); ++r)
    if (flags[r] != 0) origins.push_back(int(r));
  // No replica's own gradient was non-finite: the sum of finite values overflowed.
  const std::string from = origins.empty() ? "the all-reduced sum (it overflowed)" : ddp::describe_ranks(origins);
  std::fill(grads.begin(), grads.end(), 0.0f);  // as the optimizer step would have left them
  out.skipped.push_back({step, origins});
  ++consecutive_skips_;
  if (consecutive_skips_ >= c_.max_skips) {
    throw Error("stopped: " + std::to_string(consecutive_skips_) +
                " consecutive steps had non-finite gradients (the last, step " + std::to_string(step) +
                ", from " + from + "). Lower --lr, check the data, or raise --max-skips.");
  }
  if (comm_.rank() == 0) {
    warn("step " + std::to_string(step) + ": non-finite gradient " + (origins.empty() ? "in " : "on ") + from +
         "; every replica skipped the step (" + std::to_string(consecutive_skips_) + " of at most " +
         std::to_string(c_.max_skips) + " in a row).");
  }
  return true;
}

int Guards::shard_rank() const {
  for (const auto& f : c_.inject)
    if (f.kind == Fault::Kind::SameSeed) return 0;
  return comm_.rank();
}

void Guards::plan_step(std::span<const std::int64_t> order, std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) planned_.add(order[static_cast<std::size_t>(i)]);
}

bool Guards::check(std::int64_t step, bool epoch_end, bool last_step, std::span<float> params, std::span<float> state,
                   std::span<float> buffers, ReplicaOutput& out) {
  const bool divergence = c_.check_every > 0 && ((step + 1) % c_.check_every == 0 || last_step);
  if (!divergence && !epoch_end) return false;
  // One gather: the state's fingerprints (if due), then this window's tally.
  std::vector<std::uint64_t> words;
  if (divergence) words = fingerprint_.digests(params, state, buffers);
  const std::size_t fields = words.size();
  words.push_back(read_.count);
  words.push_back(read_.sum);
  auto before = comm_.stats().bytes_sent;
  const auto table = ddp::gather_words(comm_, words);
  out.traffic.checks += comm_.stats().bytes_sent - before;

  std::vector<ddp::SampleTally> tallies(static_cast<std::size_t>(comm_.size()));
  for (std::size_t r = 0; r < tallies.size(); ++r)
    tallies[r] = {table[r * words.size() + fields], table[r * words.size() + fields + 1]};
  if (planned_.count > 0) ++out.accounting_checks;  // (a second check in one step has nothing to count)
  if (const auto problem = ddp::audit_samples(tallies, planned_)) {
    throw Error("data accounting failed by step " + std::to_string(step) + ": " + *problem);
  }
  read_ = planned_ = {};
  if (!divergence) return false;

  auto m = ddp::find_mismatches(table, comm_.size(), 0, fields);
  ++out.divergence_checks;
  // --bn-stats local: buffers differ by design; count it, do not call it divergence.
  const auto local = std::remove_if(m.begin(), m.end(), [&](const ddp::DigestMismatch& d) {
    return !buffers_replicated_ && fingerprint_.is_buffer(d.field);
  });
  if (local != m.end()) ++out.buffer_checks_differing;
  m.erase(local, m.end());
  if (m.empty()) return true;
  // A tie (two replicas, a 2-2 split) has no majority: neither side is
  // named as the one that changed, and nothing is repaired from either.
  std::string what = "replicas diverged by step " + std::to_string(step) + ": " + fingerprint_.name(m[0].field) +
                     (m[0].tie ? " differs between " + ddp::describe_ranks(m[0].majority) + " and " +
                                     ddp::describe_ranks(m[0].ranks) + ", and no value is held by a majority"
                               : " on " + ddp::describe_ranks(m[0].ranks) + " differs from " +
                                     ddp::describe_ranks(m[0].majority));
  if (m.size() > 1) what += " (and " + std::to_string(m.size() - 1) + " more tensors)";
  const int root = ddp::healthy_rank(m, comm_.size());
  if (c_.on_divergence == OnDivergence::Stop || root < 0) {
    const bool tie = std::any_of(m.begin(), m.end(), [](const ddp::DigestMismatch& d) { return d.tie; });
    const char* why = root >= 0 ? ""
                      : tie     ? "; without a majority no replica can be trusted to repair the others"
                                : "; no replica agrees with the majority on every tensor, so none can repair";
    const char* remedy = tie ? "rerun (repair needs one value held by more replicas than any other, so 3 or more "
                               "replicas)"
                         : c_.on_divergence == OnDivergence::Stop ? "rerun, or use --on-divergence repair"
                                                                  : "rerun";
    throw Error(what + why + ". Every replica must hold identical weights; " + remedy + ".");
  }
  before = comm_.stats().bytes_sent;
  comm::broadcast(comm_, params, root);
  if (state_replicated_) comm::broadcast(comm_, state, root);
  if (buffers_replicated_ && !buffers.empty()) comm::broadcast(comm_, buffers, root);
  out.traffic.repair += comm_.stats().bytes_sent - before;
  ++out.repairs;
  if (comm_.rank() == 0)
    warn(what + "; repaired: re-broadcast rank " + std::to_string(root) +
         (state_replicated_ ? "'s weights and optimizer state."
                            : "'s weights (each rank's shard of the optimizer state is its own, --zero 1)."));
  return true;
}

}  // namespace lockstep::train::detail
