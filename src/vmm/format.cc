#include "vmm/format.h"

#include <cerrno>
#include <cstdio>

namespace kvvm {

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

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%llu bytes", static_cast<unsigned long long>(bytes));
  } else if (value == static_cast<double>(static_cast<std::uint64_t>(value))) {
    std::snprintf(text, sizeof text, "%.0f %s", value, kUnits[unit]);
  } else {
    std::snprintf(text, sizeof text, "%.2f %s", value, kUnits[unit]);
  }
  return text;
}

}  // namespace kvvm
