// The fields of the request bodies kvvm serves, declared once (request_fields.cc) and read by
// the one reader (field_reader.h): POST /v1/completions, /v1/chat/completions, /tokenize and
// /detokenize. A body read by the table is a RequestBody; openai_request.cc makes the
// EngineRequest of it, with what the fields mean together (choice_fields.cc).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "field_reader.h"

namespace kvvm::server {

// What a body's fields said, each checked by its declaration; the defaults are the table's.
struct RequestBody {
  std::string model;
  // Read after the table by their own readers (they need the tokenizer and the template).
  const nlohmann::json* prompt = nullptr;    // completions; tokenize (text only)
  const nlohmann::json* messages = nullptr;  // chat; tokenize
  // Completions' 0 is for echo, checked once the prompt is read.
  std::optional<std::int64_t> max_tokens;
  std::optional<std::int64_t> max_completion_tokens;  // chat's newer name for it
  double temperature = 0;
  double top_p = 0;
  double min_p = 0;
  std::int64_t top_k = 0;  // -1 or 0: no limit
  // DRY, llama.cpp's fields (engine::DryPenalty): last_n -1 the whole context, 0 off; the
  // breakers' strings (null: llama.cpp's default "\n", ":", "\"", "*").
  double dry_multiplier = 0;
  double dry_base = 0;
  std::int64_t dry_allowed_length = 0;
  std::int64_t dry_penalty_last_n = 0;
  std::optional<std::vector<std::string>> dry_sequence_breakers;
  std::uint64_t seed = 0;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string user;
  // The choice fields (choice_fields.h says what they mean together).
  std::int64_t n = 0;
  std::optional<std::int64_t> best_of;
  std::optional<std::int64_t> logprobs;  // completions: alternatives per token
  bool chat_logprobs = false;            // chat's logprobs
  std::optional<std::int64_t> top_logprobs;
  bool echo = false;
  double presence_penalty = 0;
  double frequency_penalty = 0;
  double repetition_penalty = 0;
  std::int64_t min_tokens = 0;
  std::vector<std::pair<std::int32_t, float>> logit_bias;
  bool ignore_eos = false;          // the model's end token does not end generation
  bool skip_special_tokens = true;  // vLLM's: the answer's text leaves special tokens out
  // Tools, read together by tool_fields.h.
  const nlohmann::json* tools = nullptr;
  const nlohmann::json* tool_choice = nullptr;
  const nlohmann::json* functions = nullptr;
  const nlohmann::json* function_call = nullptr;
  bool parallel_tool_calls = true;
  // What the chat template renders besides the messages (vLLM's chat fields).
  const nlohmann::json* chat_template_kwargs = nullptr;  // each member a template variable
  const nlohmann::json* documents = nullptr;
  bool continue_final_message = false;
  // Structured output, each as sent: structured_output.cc reads their inner structure and
  // settles them into at most one constraint.
  const nlohmann::json* response_format = nullptr;  // OpenAI's
  const nlohmann::json* guided_json = nullptr;      // vLLM's (a schema object or its text)
  const nlohmann::json* guided_regex = nullptr;
  const nlohmann::json* guided_choice = nullptr;
  const nlohmann::json* guided_grammar = nullptr;
  const nlohmann::json* structured_outputs = nullptr;  // vLLM's newer object
  // /tokenize and /detokenize (vLLM's).
  std::optional<bool> add_special_tokens;
  bool add_generation_prompt = true;
  std::vector<std::int32_t> tokens;
};

std::span<const Field<RequestBody>> request_fields();

}  // namespace kvvm::server
