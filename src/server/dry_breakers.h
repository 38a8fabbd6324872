// DRY's sequence breakers as token ids: a token is one when its text holds any of the breaker
// strings (llama.cpp's default "\n", ":", "\"", "*"), so a repetition never runs across a line
// break or a key's colon. Found by decoding every token of the vocabulary once per tokenizer and
// list, then kept: a server sees the same list request after request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::server {

// llama.cpp's default dry_sequence_breakers.
const std::vector<std::string>& default_dry_breakers();

// The ids (ascending) of `tok`'s tokens whose decoded text contains one of `breakers`.
std::vector<std::int32_t> dry_breaker_tokens(const tokenizer::Tokenizer& tok,
                                             const std::vector<std::string>& breakers);

}  // namespace kvvm::server
