// Option values the subcommands share beyond plain numbers (kit/cli_common.h): token counts
// with a K suffix, as context lengths are quoted, and comma-separated lists of counts or rates.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"

namespace CLI {
class Validator;
}  // namespace CLI

namespace kvvm::cli {

// Parses a token count: a whole number, or one with a K suffix meaning 1024 tokens, as
// context lengths are quoted ("128K" = 131072). InvalidArgument saying why otherwise.
Result<std::uint64_t> parse_token_count(std::string_view text);
// A CLI11 validator that turns a token count (parse_token_count) into its number.
CLI::Validator token_count_validator();

// "1,32" as batch sizes in [1, max]; InvalidArgument naming `option` and the bad item.
Result<std::vector<std::uint32_t>> parse_count_list(const std::string& text, const char* option,
                                                    std::uint64_t max);
// "1,2.5" as positive numbers up to `max`; InvalidArgument naming `option` and the bad item.
Result<std::vector<double>> parse_rate_list(const std::string& text, const char* option,
                                            double max);
// "a,b" as names from `allowed`, each at most once, in the order given; InvalidArgument naming
// `option` and the bad or repeated item.
Result<std::vector<std::string>> parse_choice_list(const std::string& text, const char* option,
                                                   const std::vector<std::string>& allowed);

}  // namespace kvvm::cli
