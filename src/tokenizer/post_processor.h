// tokenizer.json's "post_processor", for encode(text, add_special_tokens = true): the
// TemplateProcessing "single" template (special tokens around $A), ByteLevel (no change to the
// ids), a Sequence of those, or null. Pair templates are never used (one text per encode).
#pragma once

#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "tokenizer/json_fields.h"

namespace kvvm::tokenizer::detail {

struct PostProcessor {
  std::vector<TokenId> prefix;  // before the text's ids (a BOS)
  std::vector<TokenId> suffix;  // after them (an EOS)

  std::vector<TokenId> apply(std::vector<TokenId> ids) const;
};

Result<PostProcessor> parse_post_processor(const Json& json, std::string_view where);

}  // namespace kvvm::tokenizer::detail
