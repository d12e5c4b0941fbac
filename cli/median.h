// The median of a benchmark's repeats or of a run's per-layer times, shared by
// the commands (median.cpp). Its own header, not commands.h: the launch tests
// compile median.cpp, and commands.h would bring CLI11 (7 s of compile) in.
#pragma once

#include <vector>

namespace lockstep::cli {

// The mean of the two middle values for an even count; 0 when empty.
double median(std::vector<double> samples);

}  // namespace lockstep::cli
