#include "kit/byte_size.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace kvvm::cli {
namespace {

// "1099511627776 bytes (1 TiB)": the count to compare, and the size to read.
std::string bytes_shown(std::uint64_t bytes) {
  return std::to_string(bytes) + " bytes (" + format_bytes(bytes) + ")";
}

// The size, or the reason to refuse it.
Result<std::uint64_t> bounded_size(const std::string& text, std::uint64_t max,
                                   const std::string& why) {
  Result<std::uint64_t> bytes = parse_byte_size(text);
  const std::string limit = "the limit is " + bytes_shown(max) + (why.empty() ? "" : ": " + why);
  if (!bytes.ok()) {
    // parse_byte_size refuses a size past 64 bits; the option's limit is the useful number.
    if (bytes.status().message().ends_with("does not fit in 64 bits")) {
      return Status::InvalidArgument(bytes.status().message() + "; " + limit);
    }
    return bytes.status();
  }
  if (*bytes > max) {
    return Status::InvalidArgument("size '" + text + "' is " + bytes_shown(*bytes) + "; " + limit);
  }
  return bytes;
}

}  // namespace

CLI::Validator byte_size_validator(std::uint64_t max, const std::string& why) {
  return CLI::Validator(
      [max, why](std::string& value) -> std::string {
        Result<std::uint64_t> bytes = bounded_size(value, max, why);
        if (!bytes.ok()) return bytes.status().message();
        value = std::to_string(*bytes);
        return {};
      },
      "SIZE", "byte size");
}

std::uint64_t host_page_size() {
  const long page = ::sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<std::uint64_t>(page) : 4096;
}

CLI::Validator host_granule_validator() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        Result<std::uint64_t> bytes =
            bounded_size(value, kMaxHostGranuleBytes, "the size of the host driver's memory files");
        if (!bytes.ok()) return bytes.status().message();
        const std::uint64_t page = host_page_size();
        if (*bytes % page != 0) {
          return "host granule '" + value + "' is " + std::to_string(*bytes) +
                 " bytes, not a multiple of the page size " + std::to_string(page) + " bytes";
        }
        value = std::to_string(*bytes);
        return {};
      },
      "SIZE", "byte size");
}

}  // namespace kvvm::cli
