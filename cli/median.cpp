#include <algorithm>
#include <cstddef>
#include <vector>

#include "median.h"

namespace lockstep::cli {

// Of an even count, the mean of the two middle values: a benchmark's few
// repeats (--repeats 2) would otherwise report the slower of two times, and
// the faster of two throughputs.
double median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  const auto middle = samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2);
  std::nth_element(samples.begin(), middle, samples.end());
  if (samples.size() % 2 == 1) return *middle;
  return (*std::max_element(samples.begin(), middle) + *middle) / 2;
}

}  // namespace lockstep::cli
