// bfloat16: the top 16 bits of an IEEE float (sign, 8 exponent bits, 7
// mantissa bits). Same range as float, 8 significant bits, so rounding a
// float to bf16 has relative error at most 2^-8 (unit roundoff) for normal
// values. Used to halve the bytes of gradients on the wire
// (allreduce_bf16 in collectives.h).
//
// Contract:
//   to_bf16 rounds to nearest, ties to even. NaN stays NaN (made quiet, sign
//   kept); +-inf stays +-inf; finite values beyond bf16's largest round to inf.
//   from_bf16 is exact (every bf16 is a float).
//   The span versions convert element-wise; `in` and `out` must have equal
//   sizes (InvalidArgument otherwise) and must not overlap.
// All functions are pure and thread-safe.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "lockstep/error.h"

namespace lockstep::comm {

inline std::uint16_t to_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  // Round to nearest even on the 16 bits dropped: add 0x7fff plus the lowest
  // kept bit, so an exact tie carries only when the kept part is odd. A carry
  // out of the mantissa bumps the exponent, which is the correct rounding
  // (up to inf past the largest finite bf16).
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  // NaN: rounding could carry it into inf, or truncation could drop its whole
  // payload; keep the top bits and set the quiet bit instead.
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(is_nan ? quiet_nan : rounded);
}

inline float from_bf16(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

// out[i] = to_bf16(in[i]).
inline void to_bf16(std::span<const float> in, std::span<std::uint16_t> out) {
  if (in.size() != out.size()) {
    throw InvalidArgument("to_bf16: " + std::to_string(in.size()) + " floats into " +
                          std::to_string(out.size()) + " bf16 values");
  }
  const float* __restrict src = in.data();
  std::uint16_t* __restrict dst = out.data();
  const std::size_t n = in.size();
  for (std::size_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

// out[i] = from_bf16(in[i]).
inline void from_bf16(std::span<const std::uint16_t> in, std::span<float> out) {
  if (in.size() != out.size()) {
    throw InvalidArgument("from_bf16: " + std::to_string(in.size()) + " bf16 values into " +
                          std::to_string(out.size()) + " floats");
  }
  const std::uint16_t* __restrict src = in.data();
  float* __restrict dst = out.data();
  const std::size_t n = in.size();
  for (std::size_t i = 0; i < n; ++i) dst[i] = from_bf16(src[i]);
}

}  // namespace lockstep::comm
