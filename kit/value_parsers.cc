#include "kit/value_parsers.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <limits>

#include "kit/cli_common.h"  // parse_count, parse_number

namespace kvvm::cli {
namespace {

// Splits "a,b,c" (no empty item) and parses each with `parse`.
template <typename T, typename Parse>
Result<std::vector<T>> parse_list(const std::string& text, const char* option, Parse parse) {
  std::vector<T> values;
  std::size_t from = 0;
  while (from <= text.size()) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    Result<T> value = parse(std::string_view(text).substr(from, comma - from));
    if (!value.ok()) {
      return value.status().with_context(std::string(option) + " '" + text + "'");
    }
    values.push_back(*value);
    from = comma + 1;
  }
  return values;
}

}  // namespace

CLI::Validator token_count_validator() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        Result<std::uint64_t> count = parse_token_count(value);
        if (!count.ok()) return count.status().message();
        value = std::to_string(*count);
        return {};
      },
      "TOKENS", "token count");
}

Result<std::uint64_t> parse_token_count(std::string_view text) {
  const std::string quoted = "'" + std::string(text) + "'";
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])) != 0) {
    ++digits;
  }
  const std::string_view suffix = text.substr(digits);
  if (digits == 0 || !(suffix.empty() || suffix == "k" || suffix == "K")) {
    return Status::InvalidArgument("token count " + quoted +
                                   " is not a whole number, optionally with K for 1024 tokens "
                                   "(e.g. 8192, 128K)");
  }
  std::uint64_t count = 0;
  for (std::size_t i = 0; i < digits; ++i) {
    const auto digit = static_cast<std::uint64_t>(text[i] - '0');
    if (count > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) {
      return Status::InvalidArgument("token count " + quoted + " does not fit in 64 bits");
    }
    count = count * 10 + digit;
  }
  if (!suffix.empty()) {
    if (count > std::numeric_limits<std::uint64_t>::max() / 1024) {
      return Status::InvalidArgument("token count " + quoted + " does not fit in 64 bits");
    }
    count *= 1024;
  }
  return count;
}

Result<std::vector<std::uint32_t>> parse_count_list(const std::string& text, const char* option,
                                                    std::uint64_t max) {
  return parse_list<std::uint32_t>(
      text, option, [max](std::string_view item) -> Result<std::uint32_t> {
        KVVM_ASSIGN_OR_RETURN(std::uint64_t value, parse_count(item, 1, max));
        return static_cast<std::uint32_t>(value);
      });
}

Result<std::vector<double>> parse_rate_list(const std::string& text, const char* option,
                                            double max) {
  return parse_list<double>(text, option, [max](std::string_view item) {
    return parse_number(item, 0, max, /*min_exclusive=*/true);
  });
}

Result<std::vector<std::string>> parse_choice_list(const std::string& text, const char* option,
                                                   const std::vector<std::string>& allowed) {
  std::string names;
  for (const std::string& name : allowed) names += (names.empty() ? "" : ", ") + name;
  Result<std::vector<std::string>> chosen =
      parse_list<std::string>(text, option, [&](std::string_view item) -> Result<std::string> {
        if (std::find(allowed.begin(), allowed.end(), item) == allowed.end()) {
          return Status::InvalidArgument("'" + std::string(item) + "' is not one of " + names);
        }
        return std::string(item);
      });
  if (!chosen.ok()) return chosen.status();
  for (auto it = chosen->begin(); it != chosen->end(); ++it) {
    if (std::find(chosen->begin(), it, *it) != it) {
      return Status::InvalidArgument(std::string(option) + " '" + text + "': '" + *it +
                                     "' given twice");
    }
  }
  return chosen;
}

}  // namespace kvvm::cli
