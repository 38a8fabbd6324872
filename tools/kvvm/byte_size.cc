#include "byte_size.h"

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace kvvm::cli {

CLI::Validator byte_size_validator() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        Result<std::uint64_t> bytes = parse_byte_size(value);
        if (!bytes.ok()) return bytes.status().message();
        value = std::to_string(*bytes);
        return {};
      },
      "SIZE", "byte size");
}

}  // namespace kvvm::cli
