// Byte sizes on kvvm's command lines: the CLI11 transform that parses "2M" for an option, with
// the library's parser and formatter (kvvm/bytes.h), so `--granule 2M` means the same thing to
// `kvvm plan` as `--host-granule 2M` does to `kvvm info`, and a size prints the same in a
// library message and a report.
#pragma once

#include "kvvm/bytes.h"

namespace CLI {
class Validator;
}  // namespace CLI

namespace kvvm::cli {

using ::kvvm::format_bytes;
using ::kvvm::parse_byte_size;

// A CLI11 transform: rewrites a size ("2M") to its byte count, or refuses it with
// parse_byte_size's reason (a CLI::ValidationError at parse time).
CLI::Validator byte_size_validator();

}  // namespace kvvm::cli
