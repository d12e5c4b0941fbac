// Number formatting shared by the advisor's sentences and the table.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>

namespace lockstep::cost::detail {

__attribute__((format(printf, 1, 2))) inline std::string strf(const char* fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

// 2.68 MB, 553 MB, 1.2 GB (decimal, as bandwidths are quoted).
inline std::string bytes_text(double b) {
  if (b >= 1e9) return strf("%.3g GB", b / 1e9);
  if (b >= 1e6) return strf("%.3g MB", b / 1e6);
  if (b >= 1e3) return strf("%.3g kB", b / 1e3);
  return strf("%.0f B", b);
}

// A device's memory: sold in GiB (a "16 GB" V100 has 16 GiB), so a whole
// number of GiB prints as such, not as 17.2 GB.
inline std::string memory_text(double b) {
  const double gib = b / double(1ull << 30);
  return gib >= 1 && gib == static_cast<double>(static_cast<long long>(gib)) ? strf("%.0f GiB", gib) : bytes_text(b);
}

// A rate: whole numbers from 100 up, three significant digits below (a slow
// plan's 2.4 samples/s is not "2").
inline std::string rate_text(double v) { return v >= 100 ? strf("%.0f", v) : strf("%.3g", v); }

// The cost's unit: per useful sample once a critical batch discounts them.
inline const char* per_million(bool useful) { return useful ? "per million useful samples" : "per million samples"; }

inline std::string ms_text(double ms) {
  if (ms >= 1000) return strf("%.2f s", ms / 1000);
  if (ms >= 10) return strf("%.0f ms", ms);
  if (ms >= 0.1) return strf("%.2f ms", ms);
  return strf("%.1f us", ms * 1000);
}

}  // namespace lockstep::cost::detail
