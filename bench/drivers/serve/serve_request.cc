#include "bench/drivers/serve/serve_request.h"

#include <array>
#include <nlohmann/json.hpp>

namespace kvvm::cli {
namespace {

// splitmix64: a good spread from a few integers, with no state to carry.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Common English words, each one token in the usual BPE vocabularies (with its leading space).
constexpr std::array<const char*, 64> kWords = {
    "the",  "of",    "and",   "to",   "in",   "is",    "you",   "that",  "it",   "he",    "was",
    "for",  "on",    "are",   "as",   "with", "his",   "they",  "at",    "be",   "this",  "have",
    "from", "or",    "one",   "had",  "by",   "word",  "but",   "not",   "what", "all",   "were",
    "we",   "when",  "your",  "can",  "said", "there", "use",   "an",    "each", "which", "she",
    "do",   "how",   "their", "if",   "will", "up",    "other", "about", "out",  "many",  "then",
    "them", "these", "so",    "some", "her",  "would", "make",  "like",  "him"};

std::string words(const std::vector<TokenId>& ids, std::size_t from, std::size_t to) {
  std::string text;
  for (std::size_t i = from; i < to; ++i) {
    if (i > from) text.push_back(' ');
    text += prompt_word(ids[i]);
  }
  return text;
}

void add_common(nlohmann::ordered_json& body, std::uint64_t max_tokens) {
  body["max_tokens"] = max_tokens;
  body["temperature"] = 0;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
}

}  // namespace

std::vector<TokenId> prompt_ids(const Trace& trace, std::size_t index, std::uint64_t seed,
                                std::uint32_t vocab) {
  const TraceRequest& request = trace.requests[index];
  if (request.ids && request.ids->size() >= request.prompt_tokens) {
    return std::vector<TokenId>(request.ids->begin(),
                                request.ids->begin() + static_cast<long>(request.prompt_tokens));
  }
  std::vector<TokenId> ids;
  ids.reserve(request.prompt_tokens);
  const std::uint64_t seeded = mix(seed);
  const std::uint64_t range = vocab == 0 ? 1 : vocab;  // a vocabulary has at least one id
  for (std::uint64_t i = 0; i < request.prompt_tokens; ++i) {
    const bool shared = request.prefix_group != kNoPrefixGroup && i < request.prefix_tokens;
    // Groups and requests draw from disjoint owner numbers, so a request's own ids never
    // repeat a group's prefix by construction.
    const std::uint64_t owner = shared ? static_cast<std::uint64_t>(request.prefix_group)
                                       : (std::uint64_t{1} << 40) + index;
    ids.push_back(static_cast<TokenId>(mix(seeded ^ mix(owner) ^ mix(i + 1)) % range));
  }
  return ids;
}

const char* prompt_word(TokenId id) { return kWords[id % kWords.size()]; }

std::string completion_body(const std::string& model, const std::vector<TokenId>& ids,
                            std::uint64_t max_tokens) {
  nlohmann::ordered_json body;
  body["model"] = model;
  body["prompt"] = ids;
  add_common(body, max_tokens);
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string chat_body(const std::string& model, const std::vector<TokenId>& ids,
                      std::uint64_t prefix_tokens, std::uint64_t max_tokens) {
  const std::size_t prefix = std::min<std::size_t>(prefix_tokens, ids.size());
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (prefix > 0) messages.push_back({{"role", "system"}, {"content", words(ids, 0, prefix)}});
  messages.push_back({{"role", "user"}, {"content", words(ids, prefix, ids.size())}});
  nlohmann::ordered_json body;
  body["model"] = model;
  body["messages"] = std::move(messages);
  add_common(body, max_tokens);
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvvm::cli
