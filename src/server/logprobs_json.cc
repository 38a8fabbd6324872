#include "logprobs_json.h"

#include <cmath>
#include <string>

namespace kvvm::server {
namespace {

using nlohmann::json;

// JSON has no -infinity: a token the transforms ruled out reports the lowest float, as
// OpenAI's servers do (-9999.0 in vLLM); a NaN reports null.
json logprob_json(float value) {
  if (std::isnan(value)) return nullptr;
  if (std::isinf(value)) return value < 0 ? -9999.0 : 9999.0;
  return value;
}

json bytes_json(const std::string& text) {
  json bytes = json::array();
  for (const char c : text) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
}

}  // namespace

std::string token_text(const tokenizer::Tokenizer& tokenizer, std::int32_t id) {
  const tokenizer::TokenId one[] = {static_cast<tokenizer::TokenId>(id)};
  return tokenizer.decode(one);
}

json completion_logprobs(const tokenizer::Tokenizer& tokenizer, std::span<const ScoredToken> tokens,
                         std::size_t offset) {
  json texts = json::array();
  json logprobs = json::array();
  json tops = json::array();
  json offsets = json::array();
  for (const ScoredToken& token : tokens) {
    const std::string text = token_text(tokenizer, token.id);
    texts.push_back(text);
    offsets.push_back(offset);
    offset += text.size();
    if (token.row == nullptr) {
      logprobs.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    logprobs.push_back(logprob_json(token.row->logprob));
    json top = json::object();
    for (std::uint32_t i = 0; i < token.row->top; ++i) {
      top[token_text(tokenizer, token.row->top_ids[i])] = logprob_json(token.row->top_logprobs[i]);
    }
    tops.push_back(std::move(top));
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json chat_logprobs(const tokenizer::Tokenizer& tokenizer, std::span<const ScoredToken> tokens) {
  json content = json::array();
  for (const ScoredToken& token : tokens) {
    const std::string text = token_text(tokenizer, token.id);
    json entry = {{"token", text}, {"bytes", bytes_json(text)}};
    entry["logprob"] = token.row != nullptr ? logprob_json(token.row->logprob) : json(nullptr);
    json top = json::array();
    if (token.row != nullptr) {
      for (std::uint32_t i = 0; i < token.row->top; ++i) {
        const std::string alt = token_text(tokenizer, token.row->top_ids[i]);
        top.push_back({{"token", alt},
                       {"logprob", logprob_json(token.row->top_logprobs[i])},
                       {"bytes", bytes_json(alt)}});
      }
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

}  // namespace kvvm::server
