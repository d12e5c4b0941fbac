// Fingerprints: every collective checks that all ranks make the same call.
//
// Over point-to-point backends the check is one ring exchange on a tag of its
// own: each rank sends its fingerprint to r+1 and compares the one from r-1.
// If every neighbouring pair agrees, all ranks agree. The tag does not
// contain the sequence number, so a rank that skipped a call still meets its
// neighbour (messages on one tag pair up in order) and the skip is reported
// instead of hanging. Cost: one message of 56 bytes (the struct) per rank per collective
// and one message latency (docs/results.md).
#include "fingerprint.h"

#include <cstring>
#include <iterator>

#include "algorithms.h"
#include "lockstep/error.h"

namespace lockstep::comm {

namespace detail {

const char* kind_name(CollectiveKind kind) {
  const char* kinds[] = {"?", "allreduce", "broadcast", "barrier", "reduce_scatter", "all_gather", "gather", "scatter"};
  const auto k = static_cast<std::uint32_t>(kind);
  return k < std::size(kinds) ? kinds[k] : "?";
}

}  // namespace detail

std::string describe(const Fingerprint& fp) {
  std::string s = detail::kind_name(fp.kind);
  s += "(";
  if (fp.kind == CollectiveKind::Allreduce || fp.kind == CollectiveKind::ReduceScatter) {
    s += std::string(to_string(fp.op)) + ", ";
  }
  if (fp.kind != CollectiveKind::Barrier) {  // a barrier carries no data
    const char* type = fp.dtype == DataType::Float32 ? "float32" : fp.dtype == DataType::BFloat16 ? "bfloat16" : nullptr;
    const char* unit = type == nullptr ? " byte" : " element";
    s += (type != nullptr ? std::string(type) + ", " : std::string()) + std::to_string(fp.count) + unit +
         (fp.count == 1 ? "" : "s") + ", ";
  }
  if (fp.root >= 0) s += "root " + std::to_string(fp.root) + ", ";
  s += "seq " + std::to_string(fp.sequence);
  if (fp.algorithm != 0) s += std::string(", ") + to_string(static_cast<Algorithm>(fp.algorithm));
  if (fp.segment_bytes != 0 && fp.segment_bytes != detail::kRingSegmentBytes) {
    s += " in segments of " + std::to_string(fp.segment_bytes) + " bytes";
  }
  if (fp.global_batch != 0) s += ", global batch of " + std::to_string(fp.global_batch) + " samples";
  return s + ")";
}

namespace detail {

CollectiveScope::CollectiveScope(Communicator& comm, const char* what) : comm_(comm) {
  if (comm.in_collective_.exchange(true, std::memory_order_acquire)) {
    refuse_call(comm, std::string(what) + " was called while another collective runs on the same communicator, "
                                          "from another thread; a communicator runs one collective at a time, so "
                                          "give each thread that calls collectives a communicator of its own");
  }
}

CollectiveScope::~CollectiveScope() {
  comm_.in_collective_.store(false, std::memory_order_release);
}

Fingerprint start_collective(Communicator& comm, CollectiveKind kind, ReduceOp op, DataType dtype,
                             std::uint64_t count, int root) {
  if (static_cast<unsigned>(op) > static_cast<unsigned>(ReduceOp::Min)) {  // only a cast makes one
    refuse_call(comm, "a collective was given ReduceOp " + std::to_string(static_cast<int>(op)) +
                          "; the choices are sum, mean, max and min");
  }
  const Fingerprint fp{comm.next_sequence(), kind, op, dtype, count, root};
  if (const std::string reason = comm.abort_reason(); !reason.empty()) {
    throw CommAborted(describe(fp) + ": rank " + std::to_string(comm.rank()) +
                      ": communicator aborted: " + reason);
  }
  return fp;
}

void fingerprint_mismatch(Communicator& comm, int other_rank, const Fingerprint& mine,
                          const Fingerprint& theirs) {
  const std::string msg = "collective mismatch: rank " + std::to_string(comm.rank()) + " called " +
                          describe(mine) + " but rank " + std::to_string(other_rank) + " called " +
                          describe(theirs);
  comm.abort(msg);
  throw CommAborted(msg);
}

}  // namespace detail

void Communicator::check_fingerprint(const Fingerprint& fp) {
  Communicator& comm = *this;
  const int n = comm.size();
  if (n == 1) return;
  Fingerprint left{};
  const int r = comm.rank();
  auto recv_work = comm.post_recv((r - 1 + n) % n, detail::kFingerprintTag,
                              std::as_writable_bytes(std::span<Fingerprint>(&left, 1)));
  auto send_work =
      comm.post_send((r + 1) % n, detail::kFingerprintTag, std::as_bytes(std::span<const Fingerprint>(&fp, 1)));
  try {
    recv_work->wait(comm.timeout());
    send_work->wait(comm.timeout());
  } catch (const TimeoutError& e) {
    // The fingerprint channel's tag carries no sequence number: name the call.
    throw TimeoutError(describe(fp) + ": " + e.what());
  }
  if (!(left == fp)) detail::fingerprint_mismatch(comm, (r - 1 + n) % n, fp, left);
}

}  // namespace lockstep::comm
