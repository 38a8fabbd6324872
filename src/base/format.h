// Small formatting helpers for the library's messages: addresses in hex, errno names. Byte
// counts: kvvm/bytes.h.
#pragma once

#include <cstdint>
#include <string>

namespace kvvm {

std::string hex(std::uintptr_t value);
// "ENOMEM" for ENOMEM; "errno 123" when the name is not known.
std::string errno_name(int error);

}  // namespace kvvm
