// Byte sizes on kvvm's command lines: parsing "2M", printing "2 MiB", and the CLI11 transform
// that does the first for an option. Shared by every subcommand so `--granule 2M` means the
// same thing to `kvvm plan` as `--host-granule 2M` does to `kvvm info`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvvm/status.h"

namespace CLI {
class Validator;
}  // namespace CLI

namespace kvvm::cli {

// Parses a byte size: digits with an optional binary suffix, case-insensitive: B, K/KB/KiB,
// M/MB/MiB, G/GB/GiB, T/TB/TiB (every multiple is a power of 1024, as memory sizes and
// granules are). "2M" -> 2097152. InvalidArgument (saying why) for anything else, fractions,
// signs and overflow included.
Result<std::uint64_t> parse_byte_size(std::string_view text);

// "2 MiB", "4 KiB", "512 B", "1.50 GiB": exact multiples without decimals.
std::string format_bytes(std::uint64_t bytes);

// A CLI11 transform: rewrites a size ("2M") to its byte count, or refuses it with
// parse_byte_size's reason (a CLI::ValidationError at parse time).
CLI::Validator byte_size_validator();

}  // namespace kvvm::cli
