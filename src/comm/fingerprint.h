// Private: starting a collective (sequence number, fingerprint) and checking
// that every rank makes the same call.
#pragma once

#include <exception>
#include <string>
#include <string_view>

#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "tags.h"

namespace lockstep::comm::detail {

// "allreduce", "broadcast", ... as describe() names them.
const char* kind_name(CollectiveKind kind);

// Held for the whole of a collective (before its sequence number is taken):
// a second collective on the same communicator meanwhile, from another
// thread, is refused by name (refuse_call) instead of drawing the next
// sequence number in a data race and failing later as a garbled fingerprint
// mismatch. A communicator runs one collective at a time; a thread that
// needs its own gets a communicator of its own.
class CollectiveScope {
 public:
  CollectiveScope(Communicator& comm, const char* what);
  ~CollectiveScope();
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;

 private:
  Communicator& comm_;
};

// Fails at once on an aborted communicator; otherwise numbers the call.
Fingerprint start_collective(Communicator& comm, CollectiveKind kind, ReduceOp op, DataType dtype,
                             std::uint64_t count, int root = -1);

// Runs the body of collective `fp`. If this rank fails inside it, the group is
// aborted with a reason naming this rank and the call; if another rank's
// failure aborted the group, the error names the call this rank was in.
template <typename Body>
void run_collective(Communicator& comm, const Fingerprint& fp, Body&& body) {
  try {
    body();
  } catch (const CommAborted& e) {
    throw CommAborted(describe(fp) + ": " + e.what());
  } catch (const TimeoutError& e) {
    // It names the rank, the peer and the call's sequence number, and aborted
    // the group; the operation is named here ("recv ... timed out (collective
    // seq 103, round 0)" alone left the reader to guess which collective).
    const std::string call = describe(fp);
    if (std::string_view(e.what()).find(call) != std::string_view::npos) throw;  // named already
    throw TimeoutError(call + ": " + e.what());
  } catch (const std::exception& e) {
    comm.abort("rank " + std::to_string(comm.rank()) + " failed in " + describe(fp) + ": " + e.what());
    throw;
  }
}

[[noreturn]] void fingerprint_mismatch(Communicator& comm, int other_rank, const Fingerprint& mine,
                                       const Fingerprint& theirs);

}  // namespace lockstep::comm::detail
