// Private: the guards that keep the replicas in lockstep (docs/design.md,
// "Guards"). Each is a collective that every replica calls at the same point
// of the same step, and each decision is taken on data every replica sees
// identically, so all replicas take the same branch.
#pragma once

#include <limits>
#include <span>
#include <string>
#include <vector>

#include "lockstep/ddp/data_accounting.h"
#include "lockstep/ddp/handshake.h"
#include "lockstep/ddp/replica_digest.h"
#include "lockstep/train/trainer.h"
#include "replica.h"

namespace lockstep::train::detail {

// The handshake field that names a user's model (TrainConfig::model, with
// model_factory); a built-in model's fields hold none.
inline constexpr const char* kUserModelNameField = "model name (TrainConfig::model, with model_factory)";

// What this replica is about to run, field by field, for ddp::handshake.
// `inputs_digest`: inputs_digest(data), taken once per process.
std::vector<ddp::HandshakeField> handshake_fields(const TrainConfig& c,
                                                  const data::ImageClassificationData& data,
                                                  std::int64_t total_steps, const nn::Model& model,
                                                  std::span<const ddp::Bucket> buckets, std::uint64_t inputs_digest);

// A digest of the training inputs as they will be trained on: other image
// files, or --normalize on some ranks only, change it.
std::uint64_t inputs_digest(const data::ImageClassificationData& data);

// The buckets the reducer will build for this config (the same pure function).
std::vector<ddp::Bucket> planned_buckets(const TrainConfig& c, const nn::Layout& layout);

// Collective, after the initial broadcast: throws Error on every replica if
// any tensor differs, naming it and the ranks.
void verify_broadcast_weights(comm::Communicator& comm, const nn::Model& model);

// Whether any value is NaN, infinite or larger in magnitude than `limit`
// (one pass, vectorised).
bool has_nonfinite(std::span<const float> values, float limit = std::numeric_limits<float>::max());

// Note [Non-finite sentinel]: the gradient's first element rides as a flag.
// Just before the last tensor (tensor 0, in the bucket launched last) goes to
// the reducer, a replica whose own gradient holds a NaN or an infinity writes
// NaN there. Sum and mean carry NaN through, so after the all-reduce every
// replica reads the same verdict from one float, and the common case costs
// no collective at all. A sum of finite values can overflow in any element,
// not only the first: so a local value past overflow_limit(terms), where the
// sum of `terms` such values (the ragged weights add up to the replica count)
// could pass float's range, counts as non-finite too.
// Sharded (--zero 1), each rank holds only its own chunk of the reduced
// buckets, so the flag rides at the start of every rank's chunk of the
// bucket launched last (`at`), and each rank reads its own (`mine`).
float overflow_limit(std::int64_t terms);  // FLT_MAX / (2 terms)
void mark_nonfinite_sentinel(std::span<float> grads, bool local_nonfinite, std::span<const std::size_t> at = {});
bool reduced_nonfinite_sentinel(std::span<const float> grads, std::size_t mine = 0);

// Fingerprints of the replica's state: every parameter tensor, every
// optimizer slot of every tensor (unless the state is sharded, --zero 1:
// each rank's shard is its own, so there is nothing to compare), then every
// buffer (batch norm's running statistics; identical across replicas only
// with --bn-stats sync).
class StateFingerprint {
 public:
  StateFingerprint(const nn::Layout& layout, const optim::Optimizer& optimizer, const nn::Layout& buffers,
                   bool state_replicated);
  // One digest per field, in field order (compared across ranks by Guards::check).
  std::vector<std::uint64_t> digests(std::span<const float> params, std::span<const float> state,
                                     std::span<const float> buffers) const;
  const std::string& name(std::size_t field) const { return names_[field]; }
  bool is_buffer(std::size_t field) const { return fields_[field].source == Source::Buffers; }

 private:
  enum class Source { Params, State, Buffers };
  struct Field {
    Source source;
    std::size_t offset, numel;
  };
  std::vector<Field> fields_;
  std::vector<std::string> names_;
};

// The guards of one replica's step loop.
class Guards {
 public:
  Guards(const TrainConfig& c, const TrainHooks& hooks, comm::Communicator& comm, const nn::Model& model,
         const optim::Optimizer& optimizer);

  bool injects(Fault::Kind kind, std::int64_t step) const;
  // At the start of a step: --inject throw.
  void maybe_throw(std::int64_t step) const;
  // After the optimizer update: --inject bitflip (a weight), bitflip-buffer (a buffer value).
  void maybe_flip_bit(std::int64_t step, std::span<float> params, std::span<float> buffers) const;

  // After the all-reduce. `reduced_nonfinite` is the all-reduced sentinel
  // (Note [Non-finite sentinel]), the same on every replica; only when it is
  // set do the replicas exchange their local flags, to name the origin.
  // Returns true if every replica must skip this step (then the gradients
  // are zeroed here); throws Error on every replica after max_skips
  // consecutive skips.
  bool skip_step(std::int64_t step, bool reduced_nonfinite, bool local_nonfinite, std::span<float> grads,
                 ReplicaOutput& out);
  // The last steps skipped in a row (a checkpoint keeps it: Note [Skips
  // across a resume]).
  std::int64_t skips_in_a_row() const { return consecutive_skips_; }

  // Exactly-once data accounting (ddp/data_accounting.h). The rank whose
  // shard this replica reads (its own, unless --inject same-seed); each
  // sample it reads; and, on every replica, the group's planned global batch
  // of each step: positions [begin, end) of the epoch order.
  int shard_rank() const;
  void read_sample(std::int64_t index) { read_.add(index); }
  void plan_step(std::span<const std::int64_t> order, std::int64_t begin, std::int64_t end);

  // Every check_every steps, and at the end of every epoch and of the run:
  // one gather of the state fingerprints (divergence detector; every
  // check_every steps and after the run's last step, so the weights a run
  // ends with are always compared) and of the samples read since the last check
  // (accounting). Throws Error on every replica when the accounting fails or
  // the replicas diverged (stop), or re-broadcasts from a majority replica
  // (repair). Returns whether the divergence detector ran. `last_step`: also
  // a step whose state is kept (a checkpoint, a stop), compared as the last is.
  //
  // Note [Audit before a checkpoint]: a checkpoint step audits the samples
  // read since the last check whatever check_every is (the caller passes it
  // as `epoch_end`). The tallies are not kept in the checkpoint, so a window
  // left open at a mid-epoch checkpoint was never audited: with --check-every
  // 0 a run that read overlapping shards up to a checkpoint and then failed
  // went on from it (--resume, launch --max-restarts) and its summary said
  // each sample was read exactly once.
  bool check(std::int64_t step, bool epoch_end, bool last_step, std::span<float> params, std::span<float> state,
             std::span<float> buffers, ReplicaOutput& out);

 private:
  void warn(const std::string& message) const;
  const TrainConfig& c_;
  const TrainHooks& hooks_;
  comm::Communicator& comm_;
  const nn::Layout& layout_;
  const nn::Layout& buffer_layout_;
  bool buffers_replicated_;  // --bn-stats sync or --deterministic: buffers must agree too
  bool state_replicated_;    // not under --zero 1 (over more than one replica)
  StateFingerprint fingerprint_;
  std::int64_t consecutive_skips_;  // from TrainConfig::initial_skips_in_a_row
  ddp::SampleTally read_, planned_;  // since the last check
};

}  // namespace lockstep::train::detail
