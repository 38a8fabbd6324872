#include "base/format.h"

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

}  // namespace kvvm
