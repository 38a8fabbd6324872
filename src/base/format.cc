#include "base/format.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kvvm/base/bytes.h"

namespace kvvm {

std::string str(std::uint64_t value) { return std::to_string(value); }

std::string fixed(double value, int decimals) {
  if (std::isnan(value)) return "n/a";
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

namespace {

// `value` rounded to three significant digits (what significant() shows), so the unit and the
// decimals are chosen from the number printed: 0.9996 s is "1.00 s", not "1000 ms".
double rounded(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", value);
  return std::strtod(text, nullptr);
}

}  // namespace

std::string significant(double value) {
  if (!std::isfinite(value)) return "n/a";
  const double shown = std::fabs(rounded(value));
  if (shown == 0) return "0";
  if (shown >= 1000) return fixed(value, 0);
  // Two decimals below 10, one below 100, none below 1000; more below 1.
  const int decimals = 2 - static_cast<int>(std::floor(std::log10(shown)));
  return fixed(value, decimals);
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "n/a";
  if (seconds == 0) return "0 s";
  const double shown = rounded(seconds);
  if (shown < 1e-6) return significant(seconds * 1e9) + " ns";
  if (shown < 1e-3) return significant(seconds * 1e6) + " µs";
  if (shown < 1) return significant(seconds * 1e3) + " ms";
  if (shown < 60) return significant(seconds) + " s";
  char text[48];
  const long long whole = std::llround(seconds);
  if (whole < 3600) {
    std::snprintf(text, sizeof text, "%lld min %02lld s", whole / 60, whole % 60);
  } else {
    const long long minutes = (whole + 30) / 60;
    std::snprintf(text, sizeof text, "%lld h %02lld min", minutes / 60, minutes % 60);
  }
  return text;
}

std::string format_rate(double per_second, std::string_view unit) {
  return significant(per_second) + " " + std::string(unit) + "/s";
}

std::string format_byte_rate(double bytes_per_second) {
  if (!(bytes_per_second >= 0) || !std::isfinite(bytes_per_second) || bytes_per_second >= 1.8e19) {
    return "n/a";
  }
  return format_bytes(static_cast<std::uint64_t>(std::llround(bytes_per_second))) + "/s";
}

std::string byte_range(std::uint64_t offset, std::uint64_t len) {
  char text[64];  // snprintf, not string concatenation: GCC 12 -Wrestrict false positive
  std::snprintf(text, sizeof text, "[%llu, %llu)", static_cast<unsigned long long>(offset),
                static_cast<unsigned long long>(offset + len));
  return text;
}

std::string hex(std::uintptr_t value) {
  char text[2 + 16 + 1];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

std::string errno_name(int error) {
  switch (error) {
    case ENOMEM:
      return "ENOMEM";
    case ENOSPC:
      return "ENOSPC";
    case EINVAL:
      return "EINVAL";
    case EBADF:
      return "EBADF";
    case EMFILE:
      return "EMFILE";
    case ENFILE:
      return "ENFILE";
    case EPERM:
      return "EPERM";
    case EACCES:
      return "EACCES";
    case EAGAIN:
      return "EAGAIN";
    default:
      return "errno " + std::to_string(error);
  }
}

}  // namespace kvvm
