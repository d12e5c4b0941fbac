#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

std::span<std::byte> Communicator::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return {scratch_.data(), bytes};
}

void send(Communicator& comm, int peer, std::uint64_t tag, std::span<const std::byte> data) {
  comm.isend(peer, tag, data)->wait(comm.timeout());
}

void recv(Communicator& comm, int peer, std::uint64_t tag, std::span<std::byte> data) {
  comm.irecv(peer, tag, data)->wait(comm.timeout());
}

}  // namespace lockstep::comm
