// Small formatting helpers for messages: addresses in hex, errno names, byte counts.
#pragma once

#include <cstdint>
#include <string>

namespace kvvm {

std::string hex(std::uintptr_t value);
// "ENOMEM" for ENOMEM; "errno 123" when the name is not known.
std::string errno_name(int error);
// "2 MiB", "4 KiB", "3.5 GiB", "123 bytes".
std::string format_bytes(std::uint64_t bytes);

}  // namespace kvvm
