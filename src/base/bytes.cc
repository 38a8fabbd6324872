#include "kvvm/base/bytes.h"

#include <cctype>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

namespace kvvm {

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t unit = 0;
  std::uint64_t whole = bytes;
  bool exact = true;
  double value = static_cast<double>(bytes);
  while (unit + 1 < std::size(kUnits) && value >= 1024.0) {
    exact = exact && whole % 1024 == 0;
    whole /= 1024;
    value /= 1024.0;
    ++unit;
  }
  if (exact) return std::to_string(whole) + " " + kUnits[unit];
  char text[32];
  std::snprintf(text, sizeof text, "%.2f %s", value, kUnits[unit]);
  return text;
}

Result<std::uint64_t> parse_byte_size(std::string_view text) {
  const std::string quoted = "'" + std::string(text) + "'";
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])) != 0) {
    ++digits;
  }
  if (digits == 0) {
    return Status::InvalidArgument("size " + quoted +
                                   " does not start with a whole number (e.g. 4096, 4K, 2M, 1G)");
  }
  std::uint64_t number = 0;
  for (std::size_t i = 0; i < digits; ++i) {
    const auto digit = static_cast<std::uint64_t>(text[i] - '0');
    if (number > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) {
      return Status::InvalidArgument("size " + quoted + " does not fit in 64 bits");
    }
    number = number * 10 + digit;
  }
  // One space may separate the number from a suffix, as format_bytes writes it.
  std::string_view rest = text.substr(digits);
  if (rest.size() > 1 && rest.front() == ' ') rest.remove_prefix(1);
  std::string suffix;
  for (char c : rest) suffix += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static constexpr std::pair<const char*, int> kSuffixes[] = {
      {"", 0},    {"b", 0}, {"k", 1},  {"kb", 1},  {"kib", 1}, {"m", 2},  {"mb", 2},
      {"mib", 2}, {"g", 3}, {"gb", 3}, {"gib", 3}, {"t", 4},   {"tb", 4}, {"tib", 4},
  };
  for (const auto& [name, power] : kSuffixes) {
    if (suffix != name) continue;
    std::uint64_t bytes = number;
    for (int i = 0; i < power; ++i) {
      if (bytes > std::numeric_limits<std::uint64_t>::max() / 1024) {
        return Status::InvalidArgument("size " + quoted + " does not fit in 64 bits");
      }
      bytes *= 1024;
    }
    return bytes;
  }
  return Status::InvalidArgument("size " + quoted + " has an unknown suffix '" +
                                 std::string(text.substr(digits)) +
                                 "' (whole numbers only; suffixes: B, K, M, G, T, also KiB, KB)");
}

}  // namespace kvvm
