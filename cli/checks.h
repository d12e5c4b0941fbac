// Checks of flag values whose messages say what was expected and what was
// given: "--lr: expected a positive number up to 1000000, got '0'". Unlike
// CLI11's Range, they refuse nan and inf, and whole numbers that overflow.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

namespace lockstep::cli {

CLI::Validator number_in(double lo, double hi);  // finite, lo <= x <= hi
CLI::Validator positive_number(double hi);       // finite, 0 < x <= hi
CLI::Validator whole_number_in(std::int64_t lo, std::int64_t hi);

}  // namespace lockstep::cli
