// The job handshake (handshake.h) over Gloo unbound buffers, and the secret file.
#include "handshake.h"

#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "lockstep/error.h"

namespace lockstep::comm::gloo_backend {
namespace {

using Bytes32 = std::array<unsigned char, 32>;

// Slots of the handshake: prefix 0x81 in the top byte, apart from our
// collectives' tags (small), the fingerprint channel (0x80) and Gloo's own (0x01..0x08).
constexpr std::uint64_t kNonceSlot = std::uint64_t{0x81} << 56;
constexpr std::uint64_t kMacSlot = kNonceSlot | 1;

Bytes32 mac(const std::string& secret, const std::string& job_id, int prover, int verifier,
            const Bytes32& verifier_nonce, const Bytes32& prover_nonce) {
  std::string msg = "lockstep-gloo-auth-1";
  msg.push_back('\0');
  msg += job_id;
  msg.push_back('\0');
  for (const std::int32_t r : {std::int32_t(prover), std::int32_t(verifier)}) {
    msg.append(reinterpret_cast<const char*>(&r), sizeof(r));
  }
  msg.append(reinterpret_cast<const char*>(verifier_nonce.data()), verifier_nonce.size());
  msg.append(reinterpret_cast<const char*>(prover_nonce.data()), prover_nonce.size());
  Bytes32 out{};
  unsigned int len = 0;
  static const unsigned char kEmpty = 0;
  const void* key = secret.empty() ? static_cast<const void*>(&kEmpty) : secret.data();
  if (HMAC(EVP_sha256(), key, static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len) == nullptr ||
      len != out.size()) {
    throw Error("HMAC-SHA256 failed (OpenSSL)");
  }
  return out;
}

// One exchange with every peer: send ours[i] to peer i, receive theirs[i] from it.
void exchange(Mesh& mesh, std::uint64_t slot, std::vector<Bytes32>& ours, std::vector<Bytes32>& theirs,
              Duration timeout, const char* what) {
  const int n = mesh.size, r = mesh.rank;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends(n), recvs(n);
  for (int i = 0; i < n; ++i) {
    if (i == r) continue;
    recvs[i] = mesh.createUnboundBuffer(theirs[i].data(), theirs[i].size());
    recvs[i]->recv(i, slot);
    sends[i] = mesh.createUnboundBuffer(ours[i].data(), ours[i].size());
    sends[i]->send(i, slot);
  }
  // One deadline for all peers: waited one after another, each with the
  // whole timeout, N-1 slow peers could stretch the handshake N-1 times.
  const auto deadline = comm::deadline_after(timeout);
  const auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  for (int i = 0; i < n; ++i) {
    if (i == r) continue;
    const std::string peer = "rank " + std::to_string(i) + " at " + mesh.peer_address(i);
    try {
      if (!recvs[i]->waitRecv(nullptr, left()) || !sends[i]->waitSend(nullptr, left())) {
        throw CommAborted("rank " + std::to_string(r) + ": handshake with " + peer + " aborted");
      }
    } catch (const gloo::Exception& e) {
      const std::string why = e.what();
      if (why.find("Timed out") != std::string::npos) {
        throw TimeoutError("rank " + std::to_string(r) + ": " + peer + " did not send its handshake " + what +
                           " within " + std::to_string(timeout.count()) + " ms; refused");
      }
      throw CommAborted("rank " + std::to_string(r) + ": connection to " + peer +
                        " failed during the handshake (" + what + "): " + why);
    }
  }
}

}  // namespace

std::string read_secret_file(const std::string& path) {
  // Each message names the file as the option gives it and says what to do.
  const std::string what = "secret file (secret_file, --secret-file) " + path;
  const std::string remedy = "; give every rank the same file of random bytes, readable by its owner only "
                             "(e.g. head -c 32 /dev/urandom > s; chmod 600 s)";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InvalidArgument(what + ": " + std::strerror(errno) + remedy);
  if (!S_ISREG(st.st_mode)) throw InvalidArgument(what + " is not a regular file" + remedy);
  if ((st.st_mode & 077) != 0) {
    std::ostringstream mode;
    mode << std::oct << (st.st_mode & 0777);
    throw InvalidArgument(what + " has mode 0" + mode.str() + "; it must be readable by its owner only (chmod 600 " +
                          path + ")");
  }
  // A secret is a few dozen bytes; a file of gigabytes given by mistake
  // (a data set, an image) would be read whole before any peer was met.
  constexpr off_t kMaxSecretBytes = 64 << 10;
  if (st.st_size > kMaxSecretBytes) {
    throw InvalidArgument(what + " is " + std::to_string(st.st_size) + " bytes, more than a secret's limit of " +
                          std::to_string(kMaxSecretBytes) + " bytes" + remedy);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(what + ": cannot read it" + remedy);
  std::string secret(static_cast<std::size_t>(kMaxSecretBytes) + 1, '\0');  // no more, should it grow meanwhile
  in.read(secret.data(), static_cast<std::streamsize>(secret.size()));
  secret.resize(static_cast<std::size_t>(in.gcount()));
  if (secret.size() > static_cast<std::size_t>(kMaxSecretBytes)) {
    throw InvalidArgument(what + " grew past a secret's limit of " + std::to_string(kMaxSecretBytes) +
                          " bytes while it was read" + remedy);
  }
  if (secret.empty()) throw InvalidArgument(what + " is empty" + remedy);
  return secret;
}

void authenticate_peers(Mesh& mesh, const std::string& secret, const std::string& job_id, Duration timeout) {
  const int n = mesh.size, r = mesh.rank;
  std::vector<Bytes32> my_nonce(n), peer_nonce(n);
  for (int i = 0; i < n; ++i) {
    if (i != r && RAND_bytes(my_nonce[i].data(), static_cast<int>(my_nonce[i].size())) != 1) {
      throw Error("rank " + std::to_string(r) + ": RAND_bytes failed (OpenSSL)");
    }
  }
  exchange(mesh, kNonceSlot, my_nonce, peer_nonce, timeout, "nonce");

  std::vector<Bytes32> my_mac(n), peer_mac(n);
  for (int i = 0; i < n; ++i) {
    if (i != r) my_mac[i] = mac(secret, job_id, r, i, peer_nonce[i], my_nonce[i]);
  }
  exchange(mesh, kMacSlot, my_mac, peer_mac, timeout, "proof");

  for (int i = 0; i < n; ++i) {
    if (i == r) continue;
    const Bytes32 want = mac(secret, job_id, i, r, my_nonce[i], peer_nonce[i]);
    if (CRYPTO_memcmp(want.data(), peer_mac[i].data(), want.size()) != 0) {
      throw Error("rank " + std::to_string(r) + ": peer rank " + std::to_string(i) + " at " +
                  mesh.peer_address(i) + " failed to prove the job secret" +
                  (secret.empty() ? " (this rank has none)" : "") +
                  "; refused. Every rank must use the same secret_file (--secret-file) and job id");
    }
  }
}

}  // namespace lockstep::comm::gloo_backend
