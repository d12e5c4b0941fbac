// Philox4x32-10: ten rounds of two 32x32->64 multiplications, the key bumped
// by the Weyl constants between rounds. Random123's known answers are in
// tests/nn/cnn_layers_test.cpp.
#include "lockstep/nn/philox.h"

namespace lockstep::nn {

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> c, std::array<std::uint32_t, 2> k) {
  constexpr std::uint64_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;
  constexpr std::uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    const std::uint64_t p0 = kM0 * c[0], p1 = kM1 * c[2];
    c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
  }
  return c;
}

}  // namespace lockstep::nn
