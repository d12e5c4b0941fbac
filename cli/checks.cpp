#include "checks.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

namespace lockstep::cli {
namespace {

std::string show(double x) {
  char buf[32];
  if (std::fabs(x) < 1e15 && x == std::floor(x)) {
    std::snprintf(buf, sizeof buf, "%.0f", x);
  } else {
    std::snprintf(buf, sizeof buf, "%g", x);
  }
  return buf;
}

// The whole text as a finite decimal double, or false. Also false for a
// number too small for a double ("1e-400"), which strtod reads as 0 with
// ERANGE: taken, it turned --clip-grad-norm off, --peak-gflops to "measure
// it" and --bucket-mb to one bucket, the meanings of 0, without a word. And
// for what strtod would take but a whole-number flag refuses: hex ("--lr
// 0x10" trained at 16) and leading spaces.
bool parse_number(const std::string& text, double& out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ||
      text.find_first_of("xX") != std::string::npos)
    return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(text.c_str(), &end);
  if (errno == ERANGE && out == 0) return false;
  return *end == '\0' && std::isfinite(out);
}

}  // namespace

CLI::Validator number_in(double lo, double hi) {
  const std::string want = "a number from " + show(lo) + " to " + show(hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double x = 0;
        if (parse_number(text, x) && x >= lo && x <= hi) return {};
        return "expected " + want + ", got '" + text + "'";
      },
      "NUMBER in [" + show(lo) + ", " + show(hi) + "]");
}

namespace {

// 0, or a number float32 holds up to hi (FLT_MIN <= x <= hi): a smaller one
// would be stored as 0. `want` says so in the message, `type` in --help.
CLI::Validator zero_or_float(double hi, const std::string& want, const std::string& type) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double x = 0;
        if (parse_number(text, x) && (x == 0 || (x >= double(std::numeric_limits<float>::min()) && x <= hi)))
          return {};
        return "expected " + want + ", got '" + text + "'";
      },
      type);
}

}  // namespace

CLI::Validator off_or_float_number(double hi) {
  const std::string least = show(std::numeric_limits<float>::min());
  return zero_or_float(hi, "0 (off) or a number float32 holds, from " + least + " to " + show(hi),
                       "0 or NUMBER in [" + least + ", " + show(hi) + "]");
}

CLI::Validator float_number_upto(double hi) {
  return zero_or_float(hi,
                       "a number from 0 to " + show(hi) + " (0, or at least " +
                           show(std::numeric_limits<float>::min()) + ": a float32)",
                       "NUMBER in [0, " + show(hi) + "]");
}

CLI::Validator not_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "needs a value; leave the flag out for its default" : ""; },
      "TEXT");
}

CLI::Validator positive_number(double hi) {
  const std::string want = "a positive number up to " + show(hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double x = 0;
        if (parse_number(text, x) && x > 0 && x <= hi) return {};
        return "expected " + want + ", got '" + text + "'";
      },
      "POSITIVE up to " + show(hi));
}

namespace {

// A whole number in [lo, hi] read in base 10 only. On success the text is
// rewritten as plain decimal, because CLI11 converts it afterwards with
// strtoll in base 0, which would read "010" as octal 8 and "0x10" as 16.
template <typename Int>
CLI::Validator whole_number(Int lo, Int hi) {
  const std::string want = "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        Int x = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, x);
        if (!text.empty() && ec == std::errc() && ptr == end && x >= lo && x <= hi) {
          text = std::to_string(x);
          return {};
        }
        return "expected " + want + ", got '" + text + "'";
      },
      "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace

CLI::Validator whole_number_in(std::int64_t lo, std::int64_t hi) { return whole_number(lo, hi); }

CLI::Validator unsigned_number_upto(std::uint64_t hi) {
  return whole_number<std::uint64_t>(0, hi);
}

}  // namespace lockstep::cli
