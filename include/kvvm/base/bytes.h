// Byte sizes in text, both ways: "2 MiB" out, "2M" / "2 MiB" in. One formatter for the
// library's messages and the command line, so a size reads the same wherever it is printed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvvm/base/status.h"

namespace kvvm {

// "0 B", "512 B", "4 KiB", "2 MiB", "1.50 GiB": binary units up to EiB; exact multiples
// without decimals, anything else with two.
std::string format_bytes(std::uint64_t bytes);

// Parses a byte size: digits, optionally one space, and an optional binary suffix,
// case-insensitive: B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB (every multiple is a power of
// 1024, as memory sizes and granules are). "2M" -> 2097152; format_bytes of an exact
// multiple parses back to the same count. InvalidArgument (quoting the text and saying why)
// for anything else, fractions, signs and overflow included.
Result<std::uint64_t> parse_byte_size(std::string_view text);

}  // namespace kvvm
