// The request bodies `kvvm bench serve` sends for a trace request.
//
// Completions: the prompt as token ids (the OpenAI API accepts an array of ids), drawn from
// the seed in [0, vocab); a request of a prefix group (a tenant) starts with the group's
// prefix_tokens ids, the same in every request of the group (its system prompt), so a server
// with a prefix cache can share them; the rest are the request's own. A JSONL trace's explicit
// "prompt" ids are sent as they are. Chat needs text: the same ids become one word each (a
// common English word, which the usual tokenizers encode as one token), the group's prefix as
// the system message and the rest as the user message.
//
// max_tokens is the trace's output_tokens; temperature 0; no "ignore_eos" (not every server
// knows it: vLLM's and kvvm's do, OpenAI's does not): a reply that stops early is reported with
// the output tokens the server's usage says it produced. Always streamed, with
// stream_options.include_usage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvvm/kv/prefix/prefix_cache.h"  // TokenId
#include "sim/trace.h"

namespace kvvm::cli {

// The prompt ids of `trace.requests[index]` (see above): deterministic in (seed, group or
// index, position).
std::vector<TokenId> prompt_ids(const Trace& trace, std::size_t index, std::uint64_t seed,
                                std::uint32_t vocab);

// The word a token id stands for in a chat prompt.
const char* prompt_word(TokenId id);

// {"model", "prompt": [ids], "max_tokens", "temperature": 0, "stream": true,
//  "stream_options": {"include_usage": true}}
std::string completion_body(const std::string& model, const std::vector<TokenId>& ids,
                            std::uint64_t max_tokens);

// {"model", "messages": [{"role": "system", ...} (only with a prefix), {"role": "user",
//  ...}], "max_tokens", ...}: the first `prefix_tokens` ids are the system message.
std::string chat_body(const std::string& model, const std::vector<TokenId>& ids,
                      std::uint64_t prefix_tokens, std::uint64_t max_tokens);

}  // namespace kvvm::cli
