// tokenizer.json's "normalizer": the Unicode normal forms (through utf8proc), Prepend and
// Replace (Llama-2's legacy files: Prepend "▁", Replace " " by "▁"), a Sequence of them, or
// null. Others (Lowercase, Strip, Bert, Precompiled, ...) are refused by name.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "kvvm/base/status.h"
#include "tokenizer/json_fields.h"

namespace kvvm::tokenizer::detail {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Well-formed stretches are normalised; ill-formed bytes are kept as they are, so no input
  // is lost.
  virtual std::string normalize(std::string_view text) const = 0;
};

class Regex;

// Replace's "pattern" ({"String": ...} or {"Regex": ...}), shared with the decoder of that name.
Result<std::unique_ptr<Regex>> parse_replace_pattern(const Json& json, std::string_view where);

// nullptr for a null normalizer (or an empty Sequence).
Result<std::unique_ptr<Normalizer>> parse_normalizer(const Json& json, std::string_view where);

}  // namespace kvvm::tokenizer::detail
