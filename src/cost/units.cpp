// Numbers with units for the plan's flags (lockstep/cost/units.h).
#include "lockstep/cost/units.h"

#include <charconv>
#include <cmath>
#include <string>

#include "lockstep/error.h"

namespace lockstep::cost {
namespace {

struct Split {
  double value;
  std::string_view unit;
};

bool split(std::string_view text, Split& out) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out.value);
  if (ec != std::errc()) return false;
  out.unit = std::string_view(end, text.data() + text.size() - end);
  while (!out.unit.empty() && out.unit.front() == ' ') out.unit.remove_prefix(1);
  return true;
}

double decimal_prefix(std::string_view unit, bool& ok) {
  ok = true;
  if (unit.empty()) return 1;
  switch (unit.front()) {
    case 'k':
    case 'K':
      return 1e3;
    case 'M':
      return 1e6;
    case 'G':
      return 1e9;
    case 'T':
      return 1e12;
  }
  ok = false;
  return 0;
}

}  // namespace

double parse_count(std::string_view text, std::string_view flag, std::string_view example) {
  Split s;
  bool ok = split(text, s);
  // "7B" is how parameter counts are written: B for billion, as G.
  const double scale = !ok ? 0 : s.unit == "B" ? 1e9 : decimal_prefix(s.unit, ok);
  ok = ok && s.unit.size() <= 1;
  if (!ok || !std::isfinite(s.value) || s.value <= 0)
    throw InvalidArgument(std::string(flag) + " must be a positive number such as " + std::string(example) + "; got '" +
                          std::string(text) + "'.");
  const double count = s.value * scale;  // 1e300T is finite before the unit, not after
  if (!(count >= 1 && count <= 1e24))
    throw InvalidArgument(std::string(flag) + " must be from 1 to 1e24, such as " + std::string(example) + "; got '" +
                          std::string(text) + "'.");
  return count;
}

double parse_bytes(std::string_view text, std::string_view flag) {
  Split s;
  bool ok = split(text, s);
  double scale = 1;
  if (ok) {
    std::string_view u = s.unit;
    if (!u.empty() && u.back() == 'B') u.remove_suffix(1);
    const bool binary = u.size() == 2 && u[1] == 'i';
    if (u.size() > (binary ? 2u : 1u)) ok = false;
    if (ok && !u.empty()) {
      const double dec = decimal_prefix(u.substr(0, 1), ok);
      scale = binary ? std::pow(1024.0, std::log10(dec) / 3) : dec;
    }
  }
  if (!ok || !std::isfinite(s.value) || s.value <= 0)
    throw InvalidArgument(std::string(flag) + " must be a positive size such as 16GB or 512MiB; got '" +
                          std::string(text) + "'.");
  const double bytes = s.value * scale;
  if (!(bytes >= 1 && bytes <= 1e21))
    throw InvalidArgument(std::string(flag) + " must be from 1 byte to 1 ZB, such as 16GB or 512MiB; got '" +
                          std::string(text) + "'.");
  return bytes;
}

std::vector<int> parse_replicas(std::string_view text, std::string_view flag) {
  auto fail = [&] {
    throw InvalidArgument(
        std::string(flag) +
        " must be increasing counts from 1 to 65536, as a list (1,2,4,8) or a doubling range "
        "(1-64); got '" +
        std::string(text) + "'.");
  };
  auto to_int = [&](std::string_view item) {
    int v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 1 || v > 65536) fail();
    return v;
  };
  std::vector<int> out;
  const auto dash = text.find('-');
  if (dash != std::string_view::npos) {
    const int lo = to_int(text.substr(0, dash)), hi = to_int(text.substr(dash + 1));
    if (hi < lo) fail();
    for (long v = lo; v <= hi; v *= 2) out.push_back(static_cast<int>(v));
    if (out.back() != hi) out.push_back(hi);
    return out;
  }
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    out.push_back(to_int(text.substr(pos, comma - pos)));
    if (out.size() > 1 && out.back() <= out[out.size() - 2]) fail();
    pos = comma + 1;
  }
  return out;
}

}  // namespace lockstep::cost
