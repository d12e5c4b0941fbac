// Private: a full mesh of Gloo TCP pairs, one per peer, set up through the
// rendezvous store.
//
// Gloo's own connectFullMesh waits on the store without a deadline we
// control; this does the same steps (listen per peer, publish the addresses,
// read the peers', connect) against our deadline and the group's abort key.
//
// Note [Closing the mesh]: Gloo 0.5 has no call that both closes every
// connection and wakes every thread blocked on it. It does exactly that when
// a wait on an unbound buffer times out (every pair of the context is
// signalled and closed, unbound_buffer.cc), so close_all() provokes one such
// timeout on a buffer of its own. Peers then see their connection to this
// rank fail at once.
#pragma once

#include <gloo/context.h>

#include <memory>
#include <string>
#include <vector>

#include "join.h"

namespace lockstep::comm::gloo_backend {

// The value of "addr/<rank>": for each rank i, a 4-byte length and the bytes
// of this rank's listening address for the pair with i (empty for itself).
std::string encode_addresses(const std::vector<std::vector<char>>& addresses);

// Throws IoError (InvalidArgument for the wildcard address), saying why, when
// this host cannot listen on `bind` where its peers can reach it. `me`
// ("rank 3") opens the message.
void check_bind_address(const std::string& me, const std::string& bind);

class Mesh final : public gloo::Context {
 public:
  Mesh(int rank, int size);

  // Listens on `bind` (one socket per peer; the kernel picks the ports),
  // publishes the addresses under "addr/<rank>", reads each peer's and
  // connects. TimeoutError names the ranks whose addresses did not appear by
  // `deadline`; CommAborted names the peer whose connection failed.
  void connect(RendezvousStore& store, const std::string& bind, Clock::time_point deadline);

  // The address of `peer`'s end of our connection, as the socket sees it
  // ("[ip]:port"); the address `peer` published if the socket is gone.
  const std::string& peer_address(int peer) const { return peer_addresses_.at(peer); }
  // The rank whose address appears in Gloo's error message `what`, or -1.
  int peer_named_in(const std::string& what) const;

  // Closes every connection and wakes every waiter (Note [Closing the mesh]). Never throws.
  void close_all() noexcept;

  // The node of every rank: ranks that published the same IP address (they
  // listen on one host's interface) share a node, numbered in order of their
  // lowest rank. Every rank computes it from the same published addresses,
  // so all agree. Valid after connect().
  const std::vector<int>& nodes() const { return nodes_; }

 private:
  std::vector<std::string> peer_addresses_;
  std::vector<int> nodes_;
};

}  // namespace lockstep::comm::gloo_backend
