// Byte sizes on kvvm's command lines: the CLI11 transform that parses "2M" for an option, with
// the library's parser and formatter (kvvm/base/bytes.h), so `--granule 2M` means the same thing to
// `kvvm plan` as `--host-granule 2M` does to `kvvm info`, and a size prints the same in a
// library message and a report.
//
// Why each option states a limit: a size that fits in 64 bits may still be far more than the
// option can use (a 16 EiB budget sizes bookkeeping by the byte and ends in std::bad_alloc),
// so it is refused when parsed, naming the value and the limit, before anything runs.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "kvvm/base/bytes.h"

namespace CLI {
class Validator;
}  // namespace CLI

namespace kvvm::cli {

using ::kvvm::format_bytes;
using ::kvvm::parse_byte_size;

// 16 TiB: the most a memory budget may be. Far above the memory of any one host (8 H200s hold
// 1.1 TiB), and the addresses kvvm's simulated arena reserves for its slots at most.
inline constexpr std::uint64_t kMaxBudgetBytes = std::uint64_t{16} << 40;
// 1 GiB: the largest host granule, the size of the host driver's memory files (a GPU's granule
// is 2 MiB).
inline constexpr std::uint64_t kMaxHostGranuleBytes = std::uint64_t{1} << 30;

// A CLI11 transform: rewrites a size ("2M") to its byte count, or refuses it with
// parse_byte_size's reason, or, above `max`, naming the value and the limit and saying
// `why` the limit is there (a CLI::ValidationError at parse time, prefixed with the option).
CLI::Validator byte_size_validator(std::uint64_t max = std::numeric_limits<std::uint64_t>::max(),
                                   const std::string& why = {});

// The page size of this machine (sysconf), which a host granule must be a multiple of.
std::uint64_t host_page_size();

// --host-granule: a byte size of at most kMaxHostGranuleBytes, and a multiple of the page size
// (0: the page size) whatever the backend, so a granule the host driver would refuse is refused
// at once, also where a GPU makes the option unused.
CLI::Validator host_granule_validator();

}  // namespace kvvm::cli
