// Checks of flag values whose messages say what was expected and what was
// given: "--lr: expected a positive number up to 1000000, got '0'". Unlike
// CLI11's Range, they refuse nan and inf, and whole numbers that overflow.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

namespace lockstep::cli {

CLI::Validator number_in(double lo, double hi);  // finite, lo <= x <= hi
CLI::Validator positive_number(double hi);       // finite, 0 < x <= hi
// 0 (off), or a number float32 holds (FLT_MIN <= x <= hi): a smaller one
// would be stored as 0 and turn the setting off without a word.
CLI::Validator off_or_float_number(double hi);
// A number from 0 to hi that float32 holds (0, or FLT_MIN <= x): the
// optimizer's settings, where 0 is a value, not "off".
CLI::Validator float_number_upto(double hi);
// Whole numbers are read in base 10 only ("010" is ten, "0x10" is refused).
// Attach them with ->transform(), not ->check(): they rewrite the text as
// plain decimal, and check() would hand CLI11 the original, which it reads
// with strtoll in base 0 ("010" as octal eight).
CLI::Validator whole_number_in(std::int64_t lo, std::int64_t hi);
CLI::Validator unsigned_number_upto(std::uint64_t hi);
// A value that is not the empty string: --data "" or --link-latency "" would
// otherwise read as the flag not given.
CLI::Validator not_empty();

}  // namespace lockstep::cli
