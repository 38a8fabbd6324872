// A pre-tokenizer's split pattern, compiled once by PCRE2 (UTF, Unicode properties for \s \d
// \w, ^ and $ at line ends as in Oniguruma's Ruby syntax, JIT). Ill-formed UTF-8 in the subject is
// allowed: PCRE2_MATCH_INVALID_UTF makes such bytes match nothing, so they fall between matches and
// survive as their own pieces.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"

namespace kvvm::tokenizer::detail {

// GPT-2's pattern, which the ByteLevel pre-tokenizer applies when use_regex is true.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Match {
  std::size_t begin = 0;
  std::size_t end = 0;
};

class Regex {
 public:
  // `literal`: the pattern is a plain string (Split's {"String": ...}), not a regex.
  // InvalidArgument naming `where`, the pattern and PCRE2's reason when it does not compile.
  static Result<std::unique_ptr<Regex>> compile(std::string_view pattern, bool literal,
                                                std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The successive non-overlapping, non-empty matches in `text`, left to right.
  std::vector<Match> find_all(std::string_view text) const;

 private:
  explicit Regex(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8, kept out of this header
};

}  // namespace kvvm::tokenizer::detail
