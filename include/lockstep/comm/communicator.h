// The communicator: the one narrow interface every transport implements.
//
// A communicator connects `size()` ranks. It offers tagged point-to-point
// transfers of byte spans and nothing else; collective algorithms are free
// functions written once on top of it (collectives.h), so every backend
// (in-process threads now; Gloo and MPI later) gets all of them. Nothing in
// this interface assumes shared memory.
//
// Thread-safety: a Communicator belongs to one rank and is used by one thread
// at a time. Different ranks' communicators may be used concurrently.
//
// Errors: every blocking call has a timeout. A timeout, or abort() on any rank,
// aborts the whole group: every rank blocked in wait() is woken and gets
// CommAborted (or TimeoutError on the rank that timed out), and every later
// call fails at once. Ranks whose timeouts run out at about the same moment
// (a rank that never came, with every other rank waiting the same timeout)
// may each get TimeoutError rather than CommAborted; both name the call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/comm/reduce_op.h"

namespace lockstep::comm {

using Duration = std::chrono::milliseconds;

// `from` + `timeout`, saturated: the clock's last time point when the sum is
// later than the clock can count (Duration::max() waits as long as it takes
// instead of overflowing into the past), `from` for a timeout of zero or less.
// Every deadline of the threads and MPI backends and of the reducer is taken
// this way.
std::chrono::steady_clock::time_point deadline_after(
    Duration timeout, std::chrono::steady_clock::time_point from = std::chrono::steady_clock::now());

class Communicator;
namespace detail {
class CollectiveScope;
}
// A call this rank cannot make while the other ranks go on into it (a
// collective, a reducer's step) and would wait for it until their timeout:
// aborts the group with "rank R: <what>" and throws InvalidArgument(what).
[[noreturn]] void refuse_call(Communicator& comm, const std::string& what);

// A handle to one asynchronous transfer.
class Work {
 public:
  // Destroying a Work that has not completed gives up the transfer, so its
  // buffer may be freed; never throws. What the peer sees depends on the
  // backend: the threads backend withdraws it (a copy already under way
  // finishes first) without telling the peer, whose matching call then
  // times out; Gloo and the modelled link (modelled_link.h) abort the group;
  // MPI releases the request. Call wait() unless an error is already
  // unwinding the step.
  virtual ~Work() = default;
  // Blocks until the transfer has completed. Throws TimeoutError after
  // `timeout` (and aborts the group), CommAborted if the group was aborted.
  virtual void wait(Duration timeout) = 0;
  virtual bool done() const = 0;
};

// Bytes this rank has moved, as measured at the transport.
struct CommStats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t messages_sent = 0;
};

// What a collective call is, as every rank must agree on it. Every
// collective carries one and checks it against the other ranks' before it
// moves any data; a mismatch aborts the group with both sides named.
enum class CollectiveKind : std::uint32_t { Allreduce = 1, Broadcast, Barrier, ReduceScatter, AllGather, Gather, Scatter };
enum class DataType : std::uint32_t { Float32 = 1, Bytes, BFloat16 };

struct Fingerprint {
  std::uint64_t sequence = 0;  // the call's number on this communicator
  CollectiveKind kind = CollectiveKind::Allreduce;
  ReduceOp op = ReduceOp::Sum;  // Sum for non-reducing collectives
  DataType dtype = DataType::Float32;
  std::uint64_t count = 0;      // elements per rank
  std::int32_t root = -1;       // -1 where there is none
  std::uint32_t algorithm = 0;  // the comm::Algorithm the call resolved to; 0 where there is no choice
  std::uint64_t segment_bytes = 0;  // the ring's segment size (it cuts messages and tags); 0 for others
  // The step's global sample count, where the caller weights the data by it
  // (the reducer, average_gradients); 0 for none. Ranks given different
  // counts would weight their gradients differently and go on with wrong
  // means (AllreduceOptions::global_batch).
  std::uint64_t global_batch = 0;
  bool operator==(const Fingerprint&) const = default;
};

// e.g. "allreduce(mean, float32, 1000 elements, seq 12, ring)"
std::string describe(const Fingerprint& fp);

// A backend's own all-reduce, offered where it beats the generic algorithms
// (the one capability check: Communicator::native_allreduce()). Same contract
// as comm::allreduce.
class NativeAllreduce {
 public:
  virtual ~NativeAllreduce() = default;
  // `fingerprint` is this rank's; unless `verify` is false the backend checks
  // it against the others'.
  virtual void allreduce(std::span<float> data, const Fingerprint& fingerprint, bool verify) = 0;
  // True for the threads backend's shared-memory path (Algorithm::SharedMemory,
  // which Auto prefers); false for a transport library's own all-reduce
  // (Algorithm::Native: Gloo's, MPI_Allreduce), which is only used when asked.
  virtual bool shares_memory() const { return false; }
  // The two halves of the all-reduce in place (comm::reduce_scatter_in_place,
  // comm::all_gather_in_place), for a backend whose shares_memory() is true:
  // the front door calls them only then, and runs the ring otherwise. The
  // defaults throw InvalidArgument.
  virtual void reduce_scatter(std::span<float> data, const Fingerprint& fingerprint, bool verify);
  virtual void all_gather(std::span<float> data, const Fingerprint& fingerprint, bool verify);
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Starts sending `data` to `peer` under `tag`. `data` must stay valid until
  // the returned Work completes. Messages between one pair with one tag are
  // matched in order. A tag of 2^62 or more is refused (refuse_call: the
  // group is aborted, and InvalidArgument thrown).
  //
  // Tags below 2^62 are the program's own; the library keeps the two top
  // bits (collectives' rounds under bit 62, its own channels under bit 63),
  // so an error names a program's message as "tag 7", never as a
  // collective's. The MPI backend folds every tag into MPI's narrower range
  // (mpi_tags.h), where a program's tags can meet a collective's; so a
  // program's own messages must not be in flight while a collective runs on
  // the same communicator (complete them first, or give them a communicator
  // of their own). Between collectives any tag below 2^62 is free, with one rule for
  // the MPI backend, which keeps only a tag's low 16 bits and its upper bits
  // modulo MPI's range: two of a program's messages in flight at once
  // between one pair of ranks need tags that differ in their low 16 bits.
  std::unique_ptr<Work> isend(int peer, std::uint64_t tag, std::span<const std::byte> data);
  // Starts receiving exactly `data.size()` bytes from `peer` under `tag`.
  // A size mismatch with the matching send aborts the group.
  std::unique_ptr<Work> irecv(int peer, std::uint64_t tag, std::span<std::byte> data);

  // The transport's send and receive, for any tag: what a backend
  // implements, and what the library's collectives call with their own tags
  // (isend and irecv check a program's tag, then call these). Programs call
  // isend and irecv, never these: a tag of the library's from a program can
  // be taken by a collective's receive.
  virtual std::unique_ptr<Work> post_send(int peer, std::uint64_t tag, std::span<const std::byte> data) = 0;
  virtual std::unique_ptr<Work> post_recv(int peer, std::uint64_t tag, std::span<std::byte> data) = 0;

  // Aborts the group: wakes every rank; `reason` reaches all of them.
  virtual void abort(const std::string& reason) = 0;
  // Why the group was aborted; empty while it is not.
  virtual std::string abort_reason() const = 0;
  bool aborted() const { return !abort_reason().empty(); }

  virtual CommStats stats() const = 0;

  // Checks that every rank is making the call `fp` describes; throws
  // CommAborted (and aborts the group) on a mismatch, naming both sides. The
  // default is one ring exchange of fingerprints (fingerprint.cpp); a backend
  // with shared memory compares them in place.
  virtual void check_fingerprint(const Fingerprint& fp);

  // The node (machine) of every rank, indexed by rank: ranks with equal
  // numbers share a node. Empty when the backend cannot tell. Every rank of
  // a group returns the same vector.
  virtual std::vector<int> nodes() const { return {}; }

  // The backend's native all-reduce, or null if it has none.
  virtual NativeAllreduce* native_allreduce() { return nullptr; }

  // The timeout used by blocking collectives on this communicator. It must
  // be positive (InvalidArgument otherwise: every wait would fail at once).
  Duration timeout() const { return timeout_; }
  void set_timeout(Duration timeout);

  // For collective implementations (collectives.h and one's own), not for
  // user code: calling it outside a collective desynchronises the ranks'
  // sequence numbers, and the next collective fails its fingerprint check.
  // Sequence number of the next collective; collectives derive their tags
  // from it so that messages of different calls can never be confused.
  std::uint64_t next_sequence() { return sequence_++; }

  // Per-rank scratch memory reused across collectives (avoids an allocation
  // and page faults per call). Valid until the next call to scratch().
  std::span<std::byte> scratch(std::size_t bytes);

 private:
  friend class detail::CollectiveScope;
  Duration timeout_{std::chrono::seconds(60)};
  std::uint64_t sequence_ = 0;
  std::vector<std::byte> scratch_;
  // A collective runs on this communicator (one thread at a time may run one).
  std::atomic<bool> in_collective_{false};
};

// Blocking conveniences over isend/irecv with the communicator's timeout.
void send(Communicator& comm, int peer, std::uint64_t tag, std::span<const std::byte> data);
void recv(Communicator& comm, int peer, std::uint64_t tag, std::span<std::byte> data);

template <typename T>
std::span<const std::byte> bytes_of(std::span<const T> s) {
  return std::as_bytes(s);
}
template <typename T>
std::span<std::byte> writable_bytes_of(std::span<T> s) {
  return std::as_writable_bytes(s);
}

}  // namespace lockstep::comm
