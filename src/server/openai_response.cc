#include "openai_response.h"

#include <array>
#include <random>
#include <string>

namespace kvvm::server {
namespace {

using nlohmann::json;

json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

json head_json(const ResponseHead& head, std::string_view object) {
  return {{"id", head.id}, {"object", object}, {"created", head.created}, {"model", head.model}};
}

json finish_json(std::optional<std::string_view> finish) {
  return finish ? json(std::string(*finish)) : json(nullptr);
}

json message_json(const AssistantMessage& message) {
  json out = {{"role", "assistant"}};
  // OpenAI's: content null when the answer is only calls.
  out["content"] =
      message.content.empty() && !message.calls.empty() ? json(nullptr) : json(message.content);
  out["refusal"] = nullptr;
  if (!message.reasoning.empty()) out["reasoning_content"] = message.reasoning;
  if (!message.calls.empty()) {
    json calls = json::array();
    for (const ToolCall& call : message.calls) {
      calls.push_back({{"id", call.id},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    out["tool_calls"] = std::move(calls);
  }
  return out;
}

// A streamed delta's parts; a call's first piece names it, later ones only add arguments.
void add_delta(json& out, const AssistantDelta& delta) {
  if (!delta.reasoning.empty()) out["reasoning_content"] = delta.reasoning;
  if (!delta.content.empty()) out["content"] = delta.content;
  if (delta.calls.empty()) return;
  json calls = json::array();
  for (const ToolCallDelta& call : delta.calls) {
    json piece = {{"index", call.index}};
    if (!call.id.empty()) {
      piece["id"] = call.id;
      piece["type"] = "function";
      piece["function"] = {{"name", call.name}, {"arguments", call.arguments}};
    } else {
      piece["function"] = {{"arguments", call.arguments}};
    }
    calls.push_back(std::move(piece));
  }
  out["tool_calls"] = std::move(calls);
}

}  // namespace

Usage usage_of(const engine::RequestStats& stats) {
  Usage usage;
  usage.prompt_tokens = stats.prompt_tokens;
  usage.completion_tokens = stats.generated_tokens;
  usage.cached_tokens = stats.cached_tokens;
  return usage;
}

std::string_view finish_reason(engine::RequestEnd end, bool called_tools) {
  switch (end) {
    case engine::RequestEnd::kStop:
      return called_tools ? "tool_calls" : "stop";
    case engine::RequestEnd::kLength:
      return "length";
    case engine::RequestEnd::kCancelled:
    case engine::RequestEnd::kError:
      break;
  }
  // Never sent to a client (such requests get no answer); the engine's name, for logs.
  return engine::to_string(end);
}

std::string response_id(Endpoint endpoint) {
  return random_id(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
}

std::string random_id(std::string_view prefix) {
  // Ids only need to be unlikely to repeat, not secret: one seeded generator per thread.
  thread_local std::mt19937_64 generator{std::random_device{}()};
  constexpr std::string_view kHex = "0123456789abcdef";
  constexpr int kDigits = 24;
  std::string id(prefix);
  std::uint64_t bits = 0;
  for (int i = 0; i < kDigits; ++i) {
    if (i % 16 == 0) bits = generator();
    id += kHex[bits & 0xF];
    bits >>= 4;
  }
  return id;
}

json completion_body(const ResponseHead& head, std::span<const ChoiceText> choices,
                     const Usage& usage) {
  const bool chat = head.endpoint == Endpoint::kChat;
  json all = json::array();
  for (const ChoiceText& c : choices) {
    json choice = {{"index", c.index}};
    if (chat && c.message != nullptr) {
      choice["message"] = message_json(*c.message);
    } else if (chat) {
      // refusal: null as OpenAI's (its SDK's message type has the field).
      choice["message"] = {
          {"role", "assistant"}, {"content", std::string(c.text)}, {"refusal", nullptr}};
    } else {
      choice["text"] = std::string(c.text);
    }
    choice["logprobs"] = c.logprobs;
    choice["finish_reason"] = finish_json(c.finish);
    all.push_back(std::move(choice));
  }
  json body = head_json(head, chat ? "chat.completion" : "text_completion");
  body["choices"] = std::move(all);
  body["usage"] = usage_json(usage);
  return body;
}

json completion_body(const ResponseHead& head, std::string_view text, std::string_view finish,
                     const Usage& usage) {
  const ChoiceText choice{.index = 0, .text = text, .finish = finish, .logprobs = nullptr};
  return completion_body(head, std::span<const ChoiceText>(&choice, 1), usage);
}

json stream_chunk(const ResponseHead& head, const ChoiceText& c, bool first, bool usage_follows) {
  const bool chat = head.endpoint == Endpoint::kChat;
  json choice = {{"index", c.index}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    // The last chunk may carry only the finish reason: its delta is then {} (as OpenAI's).
    if (c.delta != nullptr) {
      add_delta(delta, *c.delta);
      if (first && !delta.contains("content")) {
        delta["content"] = c.delta->calls.empty() ? json("") : json(nullptr);
      }
    } else if (first || !c.text.empty()) {
      delta["content"] = std::string(c.text);
    }
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = std::string(c.text);
  }
  choice["logprobs"] = c.logprobs;
  choice["finish_reason"] = finish_json(c.finish);
  json body = head_json(head, chat ? "chat.completion.chunk" : "text_completion");
  body["choices"] = json::array({std::move(choice)});
  if (usage_follows) body["usage"] = nullptr;
  return body;
}

json stream_chunk(const ResponseHead& head, std::string_view text, bool first,
                  std::optional<std::string_view> finish, bool usage_follows) {
  return stream_chunk(head,
                      ChoiceText{.index = 0, .text = text, .finish = finish, .logprobs = nullptr},
                      first, usage_follows);
}

json usage_chunk(const ResponseHead& head, const Usage& usage) {
  json body = head_json(
      head, head.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
  body["choices"] = json::array();
  body["usage"] = usage_json(usage);
  return body;
}

json model_body(std::string_view model, std::int64_t created, std::uint64_t max_model_len,
                std::string_view quantization) {
  return {{"id", std::string(model)},
          {"object", "model"},
          {"created", created},
          {"owned_by", "kvvm"},
          {"max_model_len", max_model_len},
          {"quantization", std::string(quantization)}};
}

json models_body(std::string_view model, std::int64_t created, std::uint64_t max_model_len,
                 std::string_view quantization) {
  return {{"object", "list"},
          {"data", json::array({model_body(model, created, max_model_len, quantization)})}};
}

std::string sse_event(const json& value) { return "data: " + dump_json(value) + "\n\n"; }

std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace kvvm::server
