// OpenAI's log-probability objects, from the rows the engine computed: completions'
// {tokens, token_logprobs, top_logprobs, text_offset} and chat's {content: [{token, logprob,
// bytes, top_logprobs}], refusal}. A token's text is its decoded bytes (a piece of a UTF-8
// character stays a piece: dumped with U+FFFD, its bytes exact in chat's `bytes`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>

#include "kvvm/model/model.h"
#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::server {

struct ScoredToken {
  std::int32_t id = 0;
  const model::RowLogprobs* row = nullptr;  // null: not scored (an echoed prompt's first token)
};

// `offset`: the length of the choice's text before the first token (text_offset's origin).
nlohmann::json completion_logprobs(const tokenizer::Tokenizer& tokenizer,
                                   std::span<const ScoredToken> tokens, std::size_t offset = 0);
nlohmann::json chat_logprobs(const tokenizer::Tokenizer& tokenizer,
                             std::span<const ScoredToken> tokens);
// The decoded text of a prompt's ids, and the bytes of one token: for echo and text_offset.
std::string token_text(const tokenizer::Tokenizer& tokenizer, std::int32_t id);

}  // namespace kvvm::server
