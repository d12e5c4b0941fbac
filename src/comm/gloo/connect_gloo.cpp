// connect_gloo: join, mesh, handshake, communicator (process_group.h).
#include <arpa/inet.h>
#include <gloo/common/error.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "build_check.h"
#include "gloo_communicator.h"
#include "handshake.h"
#include "lockstep/error.h"
#include "sigpipe.h"

namespace lockstep::comm {
namespace {

using gloo_backend::Clock;

// The local address of the interface that routes to `host`: a UDP socket
// "connected" there (no packet is sent) has it as its own address.
std::string address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) {
    throw IoError("rendezvous host '" + host + "' cannot be resolved; give bind an address of this host (--bind ADDRESS)");
  }
  const int fd = ::socket(res->ai_family, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char buf[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr) {
      out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  if (out.empty()) throw IoError("no route to rendezvous host '" + host + "'; give bind an address of this host (--bind ADDRESS)");
  return out;
}

}  // namespace

std::unique_ptr<Communicator> connect_gloo(const ProcessGroupOptions& given) {
  const ProcessGroupOptions o = with_environment(given);
  if (o.world_size == -1) {
    throw InvalidArgument("gloo: no world size given; give world_size (--world-size N, or WORLD_SIZE), the number of processes "
                          "in the job.");
  }
  if (o.world_size < 1) {
    throw InvalidArgument("gloo: world size " + std::to_string(o.world_size) +
                          " (give world_size, --world-size N or WORLD_SIZE, N >= 1)");
  }
  if (o.rank == -1) {
    throw InvalidArgument("gloo: no rank given; give each process its own rank (--rank R, or RANK), 0 to " +
                          std::to_string(o.world_size - 1) + ".");
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    throw InvalidArgument("gloo: rank " + std::to_string(o.rank) + " is not in [0, " +
                          std::to_string(o.world_size) + ") (give rank, --rank R or RANK)");
  }
  if (o.rendezvous.empty()) {
    throw InvalidArgument(
        "gloo: no rendezvous (give rendezvous, --rendezvous file:DIR or redis://HOST:PORT, or "
        "LOCKSTEP_RENDEZVOUS)");
  }
  using gloo_backend::kMaxTimeout;  // Gloo's waits overflow far beyond it
  if (o.timeout.count() <= 0 || o.rendezvous_timeout.count() <= 0 || o.timeout > kMaxTimeout ||
      o.rendezvous_timeout > kMaxTimeout) {
    throw InvalidArgument("gloo: timeouts must be positive and at most 30 days, got " +
                          std::to_string(o.timeout.count()) + " ms and a rendezvous timeout of " +
                          std::to_string(o.rendezvous_timeout.count()) + " ms");
  }
  detail::check_build("gloo", o.build);
  // Refuse a bad secret file before touching the network.
  const std::string secret =
      o.secret_file.empty() ? std::string() : gloo_backend::read_secret_file(o.secret_file);

  // Also while the device is created: its thread keeps SIGPIPE blocked for good.
  const gloo_backend::ScopedSigpipeBlock no_sigpipe;
  // Each store call gets at most the shorter timeout (a rendezvous call during
  // the join, the abort watcher's reads during training).
  const auto store_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(std::min(o.timeout, o.rendezvous_timeout));
  auto store = std::make_unique<gloo_backend::RendezvousStore>(o.rendezvous, o.job_id, store_timeout);
  // Before the rendezvous: a rank that cannot listen where it was told would
  // otherwise wait there for its peers first (its whole timeout, if it is
  // the only one started).
  // The reason goes to the store too, for the ranks already waiting there.
  if (!o.bind.empty()) {
    try {
      gloo_backend::check_bind_address("rank " + std::to_string(o.rank), o.bind);
    } catch (const Error& e) {
      gloo_backend::publish_abort(*store, e.what());  // the join's "abort": no claim of ours to withdraw yet
      throw;
    }
  }
  const auto deadline = deadline_after(o.rendezvous_timeout);
  auto mesh = std::make_shared<gloo_backend::Mesh>(o.rank, o.world_size);
  mesh->setTimeout(o.timeout);
  // Failing, the join publishes its reason and withdraws this rank's claim itself.
  const std::vector<std::string> hosts =
      gloo_backend::join(*store, o.rank, o.world_size, o.rendezvous_timeout, deadline, o.build);
  // From here on the group's aborts go under its session (join.h).
  try {
    // A file rendezvous binds loopback by default, which ranks on other hosts
    // (a shared filesystem) cannot reach: they would connect to themselves.
    if (o.bind.empty() && !store->is_redis()) {
      for (int i = 0; i < o.world_size; ++i) {
        if (hosts[i] == hosts[o.rank]) continue;
        throw InvalidArgument("rank " + std::to_string(o.rank) + ": ranks on several hosts (" + hosts[o.rank] +
                              ", and " + hosts[i] + " for rank " + std::to_string(i) +
                              ") share a file rendezvous, which listens on loopback unless told: give every "
                              "rank bind (--bind) with its host's address, or use redis://HOST:PORT");
      }
    }
    const std::string bind = !o.bind.empty()     ? o.bind
                             : store->is_redis() ? address_towards(store->host(), store->port())
                                                 : "127.0.0.1";
    mesh->connect(*store, bind, deadline);
  } catch (const TimeoutError&) {
    gloo_backend::leave_timed_out(*store, o.rank, o.world_size);
    throw;  // every rank has the same deadline and reports its own timeout, naming who is missing
  } catch (const Error& e) {
    // Any other failure here stops the group now, not at the peers' deadline.
    gloo_backend::leave_failed(*store, o.rank, o.world_size, e.what());
    throw;
  } catch (const std::exception& e) {  // Gloo's own (a pair it cannot create), or out of memory
    const std::string msg = "rank " + std::to_string(o.rank) + ": connecting the group failed: " + e.what();
    gloo_backend::leave_failed(*store, o.rank, o.world_size, msg);
    throw CommAborted(msg);
  }
  try {
    gloo_backend::authenticate_peers(*mesh, secret, o.job_id, o.timeout);
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    gloo_backend::leave_failed(*store, o.rank, o.world_size, msg);  // the reason first, then
    mesh->close_all();                                              // the broken connections
    if (dynamic_cast<const Error*>(&e) != nullptr) throw;
    throw CommAborted("rank " + std::to_string(o.rank) + ": job handshake failed: " + msg);
  }
  // Every peer has completed its handshake with this rank, so it has read
  // this rank's keys: remove them (a later job with the same id starts clean).
  gloo_backend::leave(*store, o.rank, o.world_size);
  auto comm = std::make_unique<gloo_backend::GlooCommunicator>(std::move(store), std::move(mesh));
  comm->set_timeout(o.timeout);
  return comm;
}

}  // namespace lockstep::comm
