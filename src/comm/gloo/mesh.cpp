// The mesh of TCP pairs (mesh.h), and the one place that inspects sockets:
// to log the real address of a peer, the connected socket is found among this
// process's file descriptors by the addresses both ends published.
#include "mesh.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "../algorithms.h"
#include "lockstep/error.h"

namespace lockstep::comm::gloo_backend {

std::string encode_addresses(const std::vector<std::vector<char>>& addresses) {
  std::string s;
  for (const auto& a : addresses) {
    const auto n = static_cast<std::uint32_t>(a.size());
    s.append(reinterpret_cast<const char*>(&n), sizeof(n));
    s.append(a.data(), a.size());
  }
  return s;
}

namespace {

using gloo::transport::tcp::Address;

std::vector<std::vector<char>> decode(const std::string& s, int size, int from) {
  std::vector<std::vector<char>> out;
  std::size_t pos = 0;
  for (int i = 0; i < size; ++i) {
    std::uint32_t n = 0;
    if (pos + sizeof(n) > s.size()) break;
    std::memcpy(&n, s.data() + pos, sizeof(n));
    pos += sizeof(n);
    if (pos + n > s.size()) break;
    out.emplace_back(s.begin() + pos, s.begin() + pos + n);
    pos += n;
  }
  if (static_cast<int>(out.size()) != size || pos != s.size()) {
    throw IoError("rendezvous: the addresses rank " + std::to_string(from) + " published are malformed");
  }
  return out;
}

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

// The remote end of this process's socket whose local end is `mine` or whose
// remote end is `theirs`; the listening side of a pair accepted on its
// published address, the connecting side connected to the peer's.
std::optional<sockaddr_storage> find_connected_peer(const sockaddr_storage& mine,
                                                    const sockaddr_storage& theirs) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  std::optional<sockaddr_storage> found;
  while (dirent* e = ::readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 && e->d_name[0] != '0') continue;
    sockaddr_storage local{}, remote{};
    socklen_t ll = sizeof(local), rl = sizeof(remote);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rl) != 0) continue;
    if (same_endpoint(local, mine) || same_endpoint(remote, theirs)) {
      found = remote;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

std::string strip_location(const std::string& what) {  // gloo prefixes "[file:line] "
  if (!what.empty() && what[0] == '[') {
    if (const auto end = what.find("] "); end != std::string::npos) return what.substr(end + 2);
  }
  return what;
}

// Note [A connect that outlives the deadline]: a pair waits for its peer up
// to 5x the timeout it was made with (tcp/pair.h), counted from the connect
// call, and the pairs are made before the peers' addresses are read. A peer
// whose addresses came just before the deadline would get that whole time
// again. This watch closes the mesh at the deadline (Note [Closing the
// mesh]), which wakes a connect blocked there.
class DeadlineWatch {
 public:
  DeadlineWatch(Mesh& mesh, Clock::time_point deadline)
      : thread_([this, &mesh, deadline] {
          std::unique_lock lock(mu_);
          if (cv_.wait_until(lock, deadline, [this] { return stopped_; })) return;
          fired_ = true;
          lock.unlock();
          mesh.close_all();
        }) {}
  ~DeadlineWatch() { stop(); }
  DeadlineWatch(const DeadlineWatch&) = delete;
  DeadlineWatch& operator=(const DeadlineWatch&) = delete;

  // Stops the watch; true if the deadline came first and the mesh is closed.
  bool stop() {
    {
      const std::lock_guard lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return fired_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false, fired_ = false;
  std::thread thread_;  // last: it uses the members above
};

}  // namespace

// Throws IoError, saying why, when no socket can be bound to `bind`: the name
// does not resolve (or not now: a temporary resolver failure), it resolves
// only to addresses that are not this machine's, or binding failed for
// another reason (named by errno). Gloo would say only "Unable to find
// address for" in all of these cases.
void check_bind_address(const std::string& me, const std::string& bind) {
  const std::string head = me + ": cannot listen on '" + bind + "': ";
  const std::string remedy = "; give bind (--bind) one of this host's addresses or host names.";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rv = getaddrinfo(bind.c_str(), nullptr, &hints, &list);
  const std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> found(list, &freeaddrinfo);
  if (rv != 0) {
    const std::string why = rv == EAI_AGAIN
                                ? "the name could not be resolved now, a temporary failure of the resolver ("
                                : "the name does not resolve (";
    throw IoError(head + why + gai_strerror(rv) + ")" + remedy);
  }
  // Each rank publishes the address it listens on, and peers connect to it:
  // the wildcard would be published as such, and nobody can connect to it.
  for (const addrinfo* a = found.get(); a != nullptr; a = a->ai_next) {
    const bool any4 = a->ai_family == AF_INET &&
                      reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr.s_addr == htonl(INADDR_ANY);
    const bool any6 = a->ai_family == AF_INET6 &&
                      IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (any4 || any6) {
      throw InvalidArgument(head +
                            "the wildcard address listens everywhere but cannot be given to peers to "
                            "connect to" +
                            remedy);
    }
  }
  int first_errno = 0;
  bool only_not_ours = true;
  for (const addrinfo* a = found.get(); a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    const int err = fd < 0 ? errno : (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno);
    if (fd >= 0) ::close(fd);
    if (err == 0) return;  // one address binds (port 0): Gloo can listen there
    if (first_errno == 0) first_errno = err;
    only_not_ours = only_not_ours && err == EADDRNOTAVAIL;
  }
  if (only_not_ours) throw IoError(head + "the name resolves, but to no address of this machine" + remedy);
  throw IoError(head + "binding a socket failed (" + std::strerror(first_errno) + ")" + remedy);
}

Mesh::Mesh(int rank, int size) : gloo::Context(rank, size), peer_addresses_(size) {}

void Mesh::connect(RendezvousStore& store, const std::string& bind, Clock::time_point deadline) {
  const std::string me = "rank " + std::to_string(rank);
  // Gloo resolves the name and binds a socket to the first address that
  // takes one; when none does, all it says is "Unable to find address for".
  // Trying the same here first says why.
  check_bind_address(me, bind);
  gloo::transport::tcp::attr attr;
  attr.hostname = bind;
  attr.ai_family = AF_UNSPEC;
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    const std::string what = strip_location(e.what());
    if (what.find("Unable to find address for") != std::string::npos) {  // bound here a moment ago, not now
      throw IoError(me + ": cannot listen on '" + bind + "': no address of that name could be bound (" +
                    what + "); give bind (--bind) one of this host's addresses or host names.");
    }
    throw IoError(me + ": cannot listen on '" + bind + "': " + what);
  }
  transportContext_ = device_->createContext(rank, size);
  // A pair's connect waits up to 5x this for the peer (tcp/pair.h); keep that within the deadline.
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  transportContext_->setTimeout(std::max(std::chrono::milliseconds(100), left / 5));

  std::vector<std::vector<char>> mine(size);
  for (int i = 0; i < size; ++i) {
    if (i != rank) mine[i] = transportContext_->createPair(i)->address().bytes();
  }
  if (!store.set_if_absent("addr/" + std::to_string(rank), encode_addresses(mine))) {
    // Not ours: the join checked that this rank's claim is this process's,
    // so another process published them (a duplicate of this rank).
    const std::string msg =
        "rendezvous " + store.address() + ": " + me +
        "'s addresses were published by another process; every process needs its own rank";
    publish_abort(store, msg);
    throw InvalidArgument(msg);
  }

  // Every peer's addresses, or the ranks that did not publish them in time.
  std::vector<std::vector<std::vector<char>>> theirs(size);
  Clock::time_point next_claim_check = Clock::now();
  for (;;) {
    std::vector<int> missing;
    for (int i = 0; i < size; ++i) {
      if (i == rank || !theirs[i].empty()) continue;
      if (auto v = store.try_get("addr/" + std::to_string(i))) {
        theirs[i] = decode(*v, size, i);
      } else {
        missing.push_back(i);
      }
    }
    if (missing.empty()) break;
    throw_if_aborted(store, rank);
    // A rank on this host that joined and then died would be waited for
    // until the deadline, and named as one that "did not publish" them.
    // Looked at twice a second: each look reads every missing rank's claim.
    if (Clock::now() >= next_claim_check) {
      next_claim_check = Clock::now() + std::chrono::milliseconds(500);
      for (int m : missing) {
        if (!claim_holder_exited(store, m)) continue;
        const std::string msg =
            "rendezvous " + store.address() + ": " + me + ": rank " + std::to_string(m) +
            " joined the group and then exited (killed or crashed) before it published its "
            "addresses; start the job again";
        publish_abort(store, msg);
        throw CommAborted(msg);
      }
    }
    if (Clock::now() >= deadline) {
      // Note [A rank that gave up] (join.cpp): a rank that published them
      // and withdrew them as it gave up, while this one was held up. Any
      // record counts: its claim, seen in this rank's join, removed older ones.
      const std::string gave_up = gave_up_since(store, missing, 0, size, "had published its addresses");
      std::string msg = "rendezvous " + store.address() + ": " + me + " timed out ";
      if (!missing.empty()) {
        std::string list;
        for (int m : missing) list += (list.empty() ? "" : ", ") + std::to_string(m);
        msg += std::string("waiting for the addresses of rank") + (missing.size() > 1 ? "s " : " ") + list +
               ", which joined but did not publish them";
      } else {
        msg += "waiting for its peers' addresses";
      }
      throw TimeoutError(msg + (gave_up.empty() ? "" : ": " + gave_up));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  // Nodes: the host part of each rank's published address ("[ip]:port").
  std::vector<std::string> hosts(size);
  for (int i = 0; i < size; ++i) {
    const std::vector<char>* bytes = nullptr;
    if (i == rank) {
      for (int j = 0; j < size && bytes == nullptr; ++j)
        if (j != rank) bytes = &mine[j];
    } else {
      bytes = &theirs[i][rank];
    }
    if (bytes == nullptr) continue;  // a group of one
    const std::string a = Address(*bytes).str();
    hosts[i] = a.substr(0, a.rfind(':'));
  }
  nodes_ = detail::number_nodes(hosts);

  if (size == 1) return;  // no peer to connect to
  DeadlineWatch watch(*this, deadline);
  const auto timed_out = [&](int i, const std::string& how) {
    return TimeoutError(
        "rendezvous " + store.address() + ": " + me + " timed out connecting to rank " + std::to_string(i) +
        " at " + peer_addresses_[i] + how + "; check that rank " + std::to_string(i) +
        " runs and can be reached there, or raise rendezvous_timeout (--rendezvous-timeout).");
  };
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    const Address published(theirs[i][rank]);
    peer_addresses_[i] = published.str();
    if (Clock::now() >= deadline) {
      watch.stop();
      close_all();
      throw timed_out(i, " (and the ranks after it)");
    }
    try {
      transportContext_->getPair(i)->connect(theirs[i][rank]);
    } catch (const std::exception& e) {
      if (watch.stop())
        throw timed_out(i, ": it published its addresses but did not connect by the deadline");
      const std::string msg = me + ": rendezvous: connecting to rank " + std::to_string(i) + " at " +
                              peer_addresses_[i] + " failed: " + strip_location(e.what());
      publish_abort(store, msg);
      close_all();
      throw CommAborted(msg);
    }
    if (auto remote = find_connected_peer(Address(mine[i]).getSockaddr(), published.getSockaddr())) {
      peer_addresses_[i] = Address(*remote).str();
    }
  }
  // Connected, unless the deadline came in the last moment and closed them.
  if (watch.stop()) {
    throw TimeoutError(
        "rendezvous " + store.address() + ": " + me +
        " connected to its peers just as the deadline came, which closed the connections; raise "
        "rendezvous_timeout (--rendezvous-timeout).");
  }
}

int Mesh::peer_named_in(const std::string& what) const {
  for (int i = 0; i < size; ++i) {
    if (i != rank && !peer_addresses_[i].empty() && what.find(peer_addresses_[i]) != std::string::npos)
      return i;
  }
  return -1;
}

void Mesh::close_all() noexcept {
  if (!transportContext_) return;
  try {
    char byte = 0;
    auto probe = transportContext_->createUnboundBuffer(&byte, 1);
    probe->waitRecv(nullptr, std::chrono::milliseconds(1));
  } catch (...) {  // the provoked timeout: every pair is closed now
  }
}

}  // namespace lockstep::comm::gloo_backend
