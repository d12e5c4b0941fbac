// Philox4x32-10, the counter-based random generator of Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3" (SC'11), with Random123's
// constants: a pure function from (counter, key) to four 32-bit words. Any
// draw can be computed alone, in any order, on any replica.
#pragma once

#include <array>
#include <cstdint>

namespace lockstep::nn {

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key);

}  // namespace lockstep::nn
