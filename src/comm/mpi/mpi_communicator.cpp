// The MPI backend: lockstep's Communicator over MPI point-to-point, with
// MPI_Allreduce offered as Algorithm::Native.
//
//   mpirun -np N lockstep train --backend mpi
//
// mpirun starts the ranks and connects them, so ProcessGroupOptions'
// rendezvous, bind and secret_file are not used here; rank and world size
// come from MPI (the options may state them, and must then agree).
//
// - One MPI communicator per lockstep communicator (MPI_Comm_dup of
//   MPI_COMM_WORLD), so lockstep's messages never meet a host program's.
// - isend/irecv are MPI_Isend/MPI_Irecv of bytes; tags as in mpi_tags.h
//   (Note [Tags in a window]); Work polls with a deadline (mpi_work.cpp).
// - abort() sends the reason to every peer (Note [Abort over MPI]).
// - Native all-reduce: MPI_Iallreduce (sum/max/min; mean = sum, then the
//   same 1/N scaling as our algorithms), polled like any Work, after the
//   fingerprint check every collective makes.
// - nodes(): Note [Nodes over MPI].
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../algorithms.h"
#include "../build_check.h"
#include "../fingerprint.h"
#include "../peer_check.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/error.h"
#include "mpi_channel.h"
#include "mpi_session.h"
#include "mpi_tags.h"
#include "mpi_work.h"

namespace lockstep::comm {
namespace {

using detail::MpiChannel;
using detail::MpiOp;
using detail::MpiWork;

class MpiCommunicator final : public Communicator, private NativeAllreduce {
 public:
  explicit MpiCommunicator(std::shared_ptr<MpiChannel> channel) : channel_(std::move(channel)) {}

  int rank() const override { return channel_->rank(); }
  int size() const override { return channel_->size(); }

  std::unique_ptr<Work> post_send(int peer, std::uint64_t tag, std::span<const std::byte> data) override {
    check_call(peer, "send to", data.size());
    channel_->bytes_sent += data.size();
    ++channel_->messages_sent;
    MPI_Request request = MPI_REQUEST_NULL;
    {
      auto lock = channel_->session().lock();
      detail::check_mpi(
          MPI_Isend(data.data(), static_cast<int>(data.size()), MPI_BYTE, peer,
                    detail::to_mpi_tag(tag, channel_->tag_window()), channel_->comm(), &request),
          "MPI_Isend");
    }
    return std::make_unique<MpiWork>(channel_, request,
                                     detail::MpiRequestInfo{MpiOp::Send, peer, tag, data.size(), {}});
  }

  std::unique_ptr<Work> post_recv(int peer, std::uint64_t tag, std::span<std::byte> data) override {
    check_call(peer, "recv from", data.size());
    channel_->bytes_received += data.size();
    MPI_Request request = MPI_REQUEST_NULL;
    {
      auto lock = channel_->session().lock();
      detail::check_mpi(
          MPI_Irecv(data.data(), static_cast<int>(data.size()), MPI_BYTE, peer,
                    detail::to_mpi_tag(tag, channel_->tag_window()), channel_->comm(), &request),
          "MPI_Irecv");
    }
    return std::make_unique<MpiWork>(channel_, request,
                                     detail::MpiRequestInfo{MpiOp::Recv, peer, tag, data.size(), {}});
  }

  void abort(const std::string& reason) override { channel_->abort(reason); }
  std::string abort_reason() const override { return channel_->poll_abort(); }

  CommStats stats() const override {
    return {channel_->bytes_sent.load(), channel_->bytes_received.load(), channel_->messages_sent.load()};
  }

  NativeAllreduce* native_allreduce() override { return this; }

  std::vector<int> nodes() const override { return nodes_; }
  void set_nodes(std::vector<int> nodes) { nodes_ = std::move(nodes); }

 private:
  // NativeAllreduce: MPI_Allreduce, as MPI_Iallreduce so that the wait has a deadline.
  bool shares_memory() const override { return false; }
  void allreduce(std::span<float> data, const Fingerprint& fp, bool verify) override {
    if (verify) check_fingerprint(fp);
    if (data.size() > static_cast<std::size_t>(INT_MAX)) {
      refuse_call(
          *this, "the MPI all-reduce takes at most 2^31 - 1 elements, got " + std::to_string(data.size()));
    }
    const MPI_Op op = fp.op == ReduceOp::Max ? MPI_MAX : fp.op == ReduceOp::Min ? MPI_MIN : MPI_SUM;
    MPI_Request request = MPI_REQUEST_NULL;
    {
      auto lock = channel_->session().lock();
      detail::check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT,
                                       op, channel_->comm(), &request),
                        "MPI_Iallreduce");
    }
    MpiWork(channel_, request, {MpiOp::Allreduce, -1, fp.sequence, 0, describe(fp)}).wait(timeout());
    detail::finish(data, fp.op, size());
    // MPI does not say what it sent; count what the ring would (2P(N-1)/N),
    // as the threads backend does for its shared-memory path.
    const int n = size(), r = rank();
    const std::size_t chunk = data.size() * (r + 1) / n - data.size() * r / n;
    const std::uint64_t sent = (data.size() - chunk + chunk * (n - 1)) * sizeof(float);
    channel_->bytes_sent += sent;
    channel_->bytes_received += sent;
  }

  void check_call(int peer, const char* what, std::size_t bytes) {
    const int r = rank(), n = size();
    detail::check_peer(r, n, peer, what);
    if (bytes > static_cast<std::size_t>(INT_MAX)) {
      throw InvalidArgument("rank " + std::to_string(r) + ": cannot " + what + " rank " +
                            std::to_string(peer) + " " + std::to_string(bytes) +
                            " bytes: MPI messages hold at most 2^31 - 1 bytes");
    }
    if (const std::string reason = channel_->poll_abort(); !reason.empty()) {
      throw CommAborted("rank " + std::to_string(r) + ": communicator aborted: " + reason);
    }
  }

  std::shared_ptr<MpiChannel> channel_;
  std::vector<int> nodes_;
};

// Note [Nodes over MPI]: a rank's node is its processor name
// (MPI_Get_processor_name; OpenMPI gives the host name). The names are
// exchanged once, at connect, by MPI_Iallgather of MPI_MAX_PROCESSOR_NAME
// bytes per rank, polled against the connect timeout (MPI_Allgather would
// block without one), and numbered in order of first appearance. Every rank
// numbers the same list, so every rank returns the same vector, which the
// hierarchical all-reduce needs.
// The poll does not look for abort notices, unlike MpiWork: a peer may finish
// the exchange, return from connect and abort before this rank has seen its
// own exchange complete, and that abort belongs to the next call, not to
// connect. A peer that never joins the exchange ends it by the timeout.
// Bytes: N x MPI_MAX_PROCESSOR_NAME received per rank, once per communicator.
//
// Each slot also carries the rank's build (Note [One build per group] in
// src/comm/gloo/join.cpp), after the name's terminating NUL: a build from
// before the check reads the name alone and zeroes the rest, which reads
// here as "no build stated". A build that does not fit beside the name
// (OpenMPI's 256 bytes always hold a Linux host name, at most 64, and a
// build of kMaxBuildIdBytes; MPICH's 128 may not) goes as kBuildTooLong, so that the
// exchange still completes and every rank can refuse, naming the cause.
// Returns each rank's (name, build).
constexpr char kBuildTooLong[] = "\x01";  // never a build: check_build takes printable bytes only
struct Peer {
  std::string name, build;
};

std::vector<Peer> exchange_names(MpiChannel& channel, Duration timeout, const std::string& build) {
  const int n = channel.size();
  std::array<char, MPI_MAX_PROCESSOR_NAME> mine{};
  // On a timeout the collective is still pending and MPI may write into this
  // buffer later, so it is left allocated then (below).
  auto all = std::make_unique<std::vector<char>>(static_cast<std::size_t>(n) * MPI_MAX_PROCESSOR_NAME);
  MPI_Request request = MPI_REQUEST_NULL;
  {
    auto lock = channel.session().lock();
    int length = 0;
    detail::check_mpi(MPI_Get_processor_name(mine.data(), &length), "MPI_Get_processor_name");
    const std::size_t name_bytes = strnlen(mine.data(), mine.size());
    const std::string sent = name_bytes + 1 + build.size() < mine.size() ? build : kBuildTooLong;
    if (name_bytes + 1 + sent.size() < mine.size()) std::memcpy(mine.data() + name_bytes + 1, sent.data(), sent.size());
    detail::check_mpi(MPI_Iallgather(mine.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all->data(),
                                     MPI_MAX_PROCESSOR_NAME, MPI_CHAR, channel.comm(), &request),
                      "MPI_Iallgather");
  }
  const auto deadline = deadline_after(timeout);
  for (;;) {
    int done = 0;
    {
      auto lock = channel.session().lock();
      detail::check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    }
    if (done) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      const std::string msg = "rank " + std::to_string(channel.rank()) + ": connecting over MPI, the exchange "
                              "of host names timed out after " + std::to_string(timeout.count()) +
                              " ms (a rank did not connect)";
      (void)all.release();  // still MPI's until the collective ends, which it may never do
      channel.abort(msg);
      throw TimeoutError(msg);
    }
    std::this_thread::yield();  // a nonblocking collective advances only inside MPI calls
  }
  std::vector<Peer> peers(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    const char* slot = all->data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    const std::size_t name_bytes = strnlen(slot, MPI_MAX_PROCESSOR_NAME);
    auto& p = peers[static_cast<std::size_t>(r)];
    p.name.assign(slot, name_bytes);
    if (name_bytes + 1 < MPI_MAX_PROCESSOR_NAME) {
      const char* rest = slot + name_bytes + 1;
      p.build.assign(rest, strnlen(rest, MPI_MAX_PROCESSOR_NAME - name_bytes - 1));
    }
  }
  return peers;
}

}  // namespace

std::unique_ptr<Communicator> connect_mpi(const ProcessGroupOptions& options) {
  detail::check_build("mpi", options.build);  // a program's mistake, before MPI is touched
  auto session = detail::MpiSession::acquire();
  session->note_timeout(std::chrono::duration_cast<std::chrono::milliseconds>(options.timeout));
  auto channel = std::make_shared<MpiChannel>(std::move(session), MPI_COMM_WORLD,
                                              std::chrono::duration_cast<std::chrono::milliseconds>(options.timeout));
  const int rank = channel->rank(), size = channel->size();
  // A refusal aborts the channel, so this process will not wait in
  // MPI_Finalize for peers that wait for it (Note [MPI_Finalize after a
  // failure]); it exits non-zero and mpirun ends the job.
  const auto refuse = [&](const std::string& msg) {
    channel->abort(msg);
    throw InvalidArgument(msg);
  };
  if (options.rank >= 0 && options.rank != rank) {
    refuse("MPI says this process is rank " + std::to_string(rank) + " but rank " + std::to_string(options.rank) +
           " was asked for (mpirun assigns ranks: leave rank, --rank, unset)");
  }
  if (options.world_size >= 0 && options.world_size != size) {
    refuse("rank " + std::to_string(rank) + ": MPI says the world size is " + std::to_string(size) + " but " +
           std::to_string(options.world_size) + " was asked for (mpirun -np sets it: leave world_size, --world-size, unset)");
  }
  if (static_cast<std::uint64_t>(size) + 1 >= channel->tag_window()) {
    refuse("rank " + std::to_string(rank) + ": this MPI's tag space (MPI_TAG_UB) leaves room for " +
           std::to_string(channel->tag_window()) + " collectives in flight, too few for " + std::to_string(size) +
           " ranks (src/comm/mpi/mpi_tags.h)");
  }
  const std::vector<Peer> peers = exchange_names(*channel, options.timeout, options.build);
  std::vector<std::string> names;
  if (const Peer& me = peers[static_cast<std::size_t>(rank)]; me.build != options.build) {
    refuse("rank " + std::to_string(rank) + ": the build " + options.build + " (" +
           std::to_string(options.build.size()) + " bytes) does not fit beside this host's processor name '" + me.name +
           "' in MPI's " + std::to_string(MPI_MAX_PROCESSOR_NAME) + " bytes; give a build of at most " +
           std::to_string(std::max<long>(0, long(MPI_MAX_PROCESSOR_NAME) - long(me.name.size()) - 2)) +
           " bytes (ProcessGroupOptions::build)");
  }
  for (int r = 0; r < size; ++r) {
    const Peer& p = peers[static_cast<std::size_t>(r)];
    if (p.build != options.build) {  // every rank sees the same list: all refuse, the first differing rank named
      refuse("rank " + std::to_string(rank) + ": " +
             detail::build_mismatch("rank " + std::to_string(r) + " (on " + p.name + ")",
                                    p.build == kBuildTooLong ? "(one too long to send)" : p.build, "this rank",
                                    options.build));
    }
    names.push_back(p.name);
  }
  std::vector<int> nodes = detail::number_nodes(names);
  auto comm = std::make_unique<MpiCommunicator>(std::move(channel));
  comm->set_timeout(options.timeout);
  comm->set_nodes(std::move(nodes));
  return comm;
}

}  // namespace lockstep::comm
