// tokenizer.json's "pre_tokenizer": Split (a regex or a string, any of the five delimiter
// behaviours, invert), ByteLevel (add_prefix_space, use_regex = GPT-2's pattern) and Sequence.
// Others (Whitespace, Digits, Metaspace, ...) are refused by name.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/status.h"
#include "tokenizer/json_fields.h"

namespace kvvm::tokenizer::detail {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece further (and ByteLevel spells each in the byte-level alphabet); empty
  // pieces are dropped.
  virtual void apply(std::vector<std::string>& pieces) const = 0;
  // Whether this step (or one inside it) maps pieces to the byte-level alphabet.
  virtual bool byte_level() const = 0;
};

// nullptr for null (or an empty Sequence).
Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const Json& json, std::string_view where);

}  // namespace kvvm::tokenizer::detail
