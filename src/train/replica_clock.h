// Private: the clock a replica times its steps by, and a span of it in ms.
#pragma once

#include <chrono>

namespace lockstep::train::detail {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace lockstep::train::detail
