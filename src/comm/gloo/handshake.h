// Private: the job handshake. Before any data moves, every rank proves to
// every peer that it knows the job secret, over the pair that connects them:
//
//   1. each side sends a fresh 32-byte nonce (OpenSSL RAND_bytes);
//   2. each side sends HMAC-SHA256(secret, "lockstep-gloo-auth-1" | job id |
//      prover rank | verifier rank | verifier's nonce | prover's nonce);
//   3. each side checks the peer's MAC (constant-time compare).
// Fresh nonces from both sides defeat replay; the ordered ranks defeat
// reflecting a rank's own MAC back to it. Without a secret the key is empty:
// no protection, but a connection that is not a rank of this job (a stray
// client that won the race for a listening port) is still found out.
#pragma once

#include <string>

#include "lockstep/comm/communicator.h"
#include "mesh.h"

namespace lockstep::comm::gloo_backend {

// The contents of `path`, which must be a regular file readable by its owner
// only (mode 0600 or 0400). Throws InvalidArgument otherwise, or if it is empty.
std::string read_secret_file(const std::string& path);

// Runs the handshake with every peer of `mesh`. Throws lockstep::Error naming
// the peer and its address if a peer's proof is wrong, TimeoutError if a peer
// does not answer within `timeout`, CommAborted if a connection fails. The
// caller aborts the group on any of them.
void authenticate_peers(Mesh& mesh, const std::string& secret, const std::string& job_id, Duration timeout);

}  // namespace lockstep::comm::gloo_backend
