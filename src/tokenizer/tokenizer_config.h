// tokenizer_config.json's add_bos_token / add_eos_token, applied to the post-processor.
#pragma once

#include <string_view>

#include "kvvm/base/status.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/tokenizer_impl.h"

namespace kvvm::tokenizer::detail {

// Applies the flags `config` (tokenizer_config.json's document) sets to `parts`'s
// post-processor; InvalidArgument naming `where` and the field for a flag that is not a
// boolean or a token the flag needs that is unnamed or outside the vocabulary.
Status apply_config_flags(const Json& config, std::string_view where, TokenizerParts& parts);

}  // namespace kvvm::tokenizer::detail
