// Private: the guards that keep the replicas in lockstep (docs/design.md,
// "Guards"). Each is a collective that every replica calls at the same point
// of the same step, and each decision is taken on data every replica sees
// identically, so all replicas take the same branch.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "lockstep/ddp/handshake.h"
#include "lockstep/ddp/replica_digest.h"
#include "lockstep/train/trainer.h"
#include "replica.h"

namespace lockstep::train::detail {

// What this replica is about to run, field by field, for ddp::handshake.
std::vector<ddp::HandshakeField> handshake_fields(const TrainConfig& c,
                                                  const data::ImageClassificationData& data,
                                                  std::int64_t total_steps, const nn::Model& model,
                                                  std::span<const ddp::Bucket> buckets);

// The buckets the reducer will build for this config (the same pure function).
std::vector<ddp::Bucket> planned_buckets(const TrainConfig& c, const nn::Layout& layout);

// Collective, after the initial broadcast: throws Error on every replica if
// any tensor differs, naming it and the ranks.
void verify_broadcast_weights(comm::Communicator& comm, const nn::Model& model);

// Whether any value is NaN or infinite (one pass, vectorised).
bool has_nonfinite(std::span<const float> values);

// Fingerprints of the replicated state: every parameter tensor, and every
// optimizer slot of every tensor. Buffers are per replica and not included.
class StateFingerprint {
 public:
  StateFingerprint(const nn::Layout& layout, const optim::Optimizer& optimizer);
  // Collective: every replica's fingerprints compared; the differences.
  std::vector<ddp::DigestMismatch> compare(comm::Communicator& comm, std::span<const float> params,
                                           std::span<const float> state) const;
  const std::string& name(std::size_t field) const { return names_[field]; }

 private:
  struct Field {
    bool state;  // optimizer state (else parameters)
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
  // After the optimizer update: --inject bitflip.
  void maybe_flip_bit(std::int64_t step, std::span<float> params) const;

  // After the all-reduce: combines the replicas' local non-finite flags.
  // Returns true if every replica must skip this step (then the gradients
  // are zeroed here); throws Error on every replica after max_skips
  // consecutive skips.
  bool skip_step(std::int64_t step, bool local_nonfinite, std::span<float> grads, ReplicaOutput& out);

  // Every check_every steps: the divergence detector. Throws Error on every
  // replica (stop), or re-broadcasts from a majority replica (repair).
  // Returns whether this step was checked.
  bool check_divergence(std::int64_t step, std::span<float> params, std::span<float> state,
                        ReplicaOutput& out);

 private:
  void warn(const std::string& message) const;
  const TrainConfig& c_;
  const TrainHooks& hooks_;
  comm::Communicator& comm_;
  const nn::Layout& layout_;
  StateFingerprint fingerprint_;
  std::int64_t consecutive_skips_ = 0;
};

}  // namespace lockstep::train::detail
