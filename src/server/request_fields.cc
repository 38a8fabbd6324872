#include "request_fields.h"

#include <limits>
#include <string>

#include "kvvm/model/sampling.h"

namespace kvvm::server {

using nlohmann::json;

namespace {

using B = RequestBody;

constexpr std::size_t kMaxStopStrings = 4;
constexpr std::size_t kMaxStopBytes = 256;
constexpr std::size_t kMaxDryBreakers = 32;
constexpr std::size_t kMaxLogitBias = 1024;

// Integer bounds. The context bounds max_tokens; completions' 0 is for echo.
IntegerRange context_room(const ParseContext& context) {
  return {0, context.context_tokens,
          " (the context holds " + std::to_string(context.context_tokens) + " tokens)"};
}
IntegerRange context_room_from_1(const ParseContext& context) {
  IntegerRange range = context_room(context);
  range.lo = 1;
  return range;
}
IntegerRange choice_count(const ParseContext& context) {
  return {1, context.max_n, " (the server's --max-n)"};
}
IntegerRange top_k_range(const ParseContext&) {
  return {-1, std::numeric_limits<std::uint32_t>::max(), " (-1 or 0: no limit)"};
}
IntegerRange dry_length_range(const ParseContext&) { return {0, 1 << 20, ""}; }
IntegerRange dry_last_n_range(const ParseContext&) {
  return {-1, std::numeric_limits<std::uint32_t>::max(), " (-1: the whole context, 0: off)"};
}
IntegerRange alternatives(const ParseContext&) {
  return {0, model::kMaxTopLogprobs, " (alternatives per token)"};
}

// Neutral values: what clients send that asks for nothing kvvm lacks.
bool is_false(const json& value) { return value == false; }  // "none" in some clients
bool is_empty_string(const json& value) { return value == ""; }
bool is_text_only(const json& value) {
  if (!value.is_array()) return false;
  for (const json& item : value) {
    if (item != "text") return false;
  }
  return true;
}

// stop: a string or up to 4, each 1 to 256 bytes.
Check read_stop(const json& value, std::string_view param, const ParseContext&, B* body) {
  const auto one = [&](const json& item, const std::string& item_param) -> Check {
    if (!item.is_string()) return bad_field(item_param, wrong_type(item, "a string"));
    const std::string& text = item.get_ref<const std::string&>();
    if (text.empty() || text.size() > kMaxStopBytes) {
      return bad_field(item_param, "a stop string of " + std::to_string(text.size()) +
                                       " bytes; each must be 1 to " +
                                       std::to_string(kMaxStopBytes) + " bytes");
    }
    body->stop.push_back(text);
    return std::nullopt;
  };
  const std::string name(param);
  if (value.is_string()) return one(value, name);
  if (!value.is_array()) return bad_field(param, wrong_type(value, "a string or an array"));
  if (value.size() > kMaxStopStrings) {
    return bad_field(param, std::to_string(value.size()) + " stop strings; at most " +
                                std::to_string(kMaxStopStrings));
  }
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (Check error = one(value[i], name + "[" + std::to_string(i) + "]")) return error;
  }
  return std::nullopt;
}

// dry_sequence_breakers: strings, each 1 to kMaxStopBytes bytes, as many as stop strings.
Check read_dry_breakers(const json& value, std::string_view param, const ParseContext&, B* body) {
  if (!value.is_array()) return bad_field(param, wrong_type(value, "an array of strings"));
  if (value.size() > kMaxDryBreakers) {
    return bad_field(param, std::to_string(value.size()) + " breakers; at most " +
                                std::to_string(kMaxDryBreakers));
  }
  std::vector<std::string> breakers;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::string item = std::string(param) + "[" + std::to_string(i) + "]";
    if (!value[i].is_string()) return bad_field(item, wrong_type(value[i], "a string"));
    const std::string& text = value[i].get_ref<const std::string&>();
    if (text.empty() || text.size() > kMaxStopBytes) {
      return bad_field(item, "a breaker of " + std::to_string(text.size()) +
                                 " bytes; each must be 1 to " + std::to_string(kMaxStopBytes) +
                                 " bytes");
    }
    breakers.push_back(text);
  }
  body->dry_sequence_breakers = std::move(breakers);
  return std::nullopt;
}

// logit_bias: {"<token id>": bias in [-100, 100]}, ids of the vocabulary.
Check read_logit_bias(const json& value, std::string_view param, const ParseContext& context,
                      B* body) {
  if (value.size() > kMaxLogitBias) {
    return bad_field(
        param, std::to_string(value.size()) + " entries; at most " + std::to_string(kMaxLogitBias));
  }
  for (const auto& [id_text, bias] : value.items()) {
    const std::string entry = std::string(param) + "." + id_text;
    std::int64_t id = -1;
    const bool digits = !id_text.empty() && id_text.size() <= 10 &&
                        id_text.find_first_not_of("0123456789") == std::string::npos;
    if (digits) id = std::stoll(id_text);
    if (id < 0 || id >= static_cast<std::int64_t>(context.vocab_size)) {
      return bad_field(entry, "\"" + id_text + "\" is not a token id of the vocabulary [0, " +
                                  std::to_string(context.vocab_size) + ")");
    }
    double v = 0;
    if (Check error = read_number(bias, entry, &v)) return error;
    if (v < -100 || v > 100) return bad_field(entry, shown(bias) + " is out of range [-100, 100]");
    body->logit_bias.emplace_back(static_cast<std::int32_t>(id), static_cast<float>(v));
  }
  return std::nullopt;
}

// detokenize's tokens: ids of the vocabulary.
Check read_token_ids(const json& value, std::string_view param, const ParseContext& context,
                     B* body) {
  const std::int64_t last_id = static_cast<std::int64_t>(context.vocab_size) - 1;
  for (std::size_t i = 0; i < value.size(); ++i) {
    std::int64_t id = 0;
    if (Check error = read_integer(value[i], std::string(param) + "[" + std::to_string(i) + "]", 0,
                                   last_id, " (the vocabulary's ids)", &id)) {
      return error;
    }
    body->tokens.push_back(static_cast<std::int32_t>(id));
  }
  return std::nullopt;
}

using D = Declare<B>;

constexpr Field<B> kStreamOptions[] = {
    D::boolean("include_usage", kInGeneration, &B::include_usage),
};

// Every field of every body: OpenAI's, and the vLLM extensions kvvm takes. What kvvm reads but
// does not do is accepted with its neutral value and refused as not supported otherwise;
// tools are settled with the tool choice (openai_request.cc).
constexpr Field<B> kFields[] = {
    D::string("model", kInEvery, &B::model).required_in(kInGeneration),
    D::any("prompt", kInCompletions, &B::prompt).required_in(kInCompletions),
    D::string("prompt", kInTokenize, &B::prompt),
    D::any("messages", kInChat | kInTokenize, &B::messages).required_in(kInChat),
    D::integer("max_tokens", kInCompletions, context_room, &B::max_tokens),
    D::integer("max_tokens", kInChat, context_room_from_1, &B::max_tokens),
    D::integer("max_completion_tokens", kInChat, context_room_from_1, &B::max_completion_tokens),
    D::number("temperature", kInGeneration, {.lo = 0, .hi = 2}, &B::temperature, 0),
    D::number("top_p", kInGeneration, {.lo = 0, .hi = 1, .lo_open = true}, &B::top_p, 1),
    D::integer("top_k", kInGeneration, top_k_range, &B::top_k, 0),
    D::number("min_p", kInGeneration, {.lo = 0, .hi = 1}, &B::min_p, 0),  // vLLM's
    D::seed("seed", kInGeneration, &B::seed, 0),
    D::any("stop", kInGeneration).then(read_stop),
    D::boolean("ignore_eos", kInGeneration, &B::ignore_eos, false),                   // vLLM's
    D::boolean("skip_special_tokens", kInGeneration, &B::skip_special_tokens, true),  // vLLM's
    D::boolean("stream", kInGeneration, &B::stream, false),
    D::object("stream_options", kInGeneration).with_fields(kStreamOptions),
    D::string("user", kInGeneration, &B::user),
    // How many answers, and what each reports (choice_fields.h).
    D::integer("n", kInGeneration, choice_count, &B::n, 1),
    D::integer("best_of", kInCompletions, choice_count, &B::best_of),
    D::integer("logprobs", kInCompletions, alternatives, &B::logprobs).neutral_if(is_false),
    D::boolean("logprobs", kInChat, &B::chat_logprobs, false),
    D::integer("top_logprobs", kInChat, alternatives, &B::top_logprobs),
    D::boolean("echo", kInCompletions, &B::echo, false),
    // The logits' transforms.
    D::number("presence_penalty", kInGeneration, {.lo = -2, .hi = 2}, &B::presence_penalty, 0),
    D::number("frequency_penalty", kInGeneration, {.lo = -2, .hi = 2}, &B::frequency_penalty, 0),
    D::number("repetition_penalty", kInGeneration, {.lo = 0, .hi = 10, .lo_open = true},
              &B::repetition_penalty, 1),
    D::integer("min_tokens", kInGeneration, context_room, &B::min_tokens, 0),
    // DRY, as llama.cpp's server takes it.
    D::number("dry_multiplier", kInGeneration, {.lo = 0, .hi = 100}, &B::dry_multiplier, 0),
    D::number("dry_base", kInGeneration, {.lo = 1, .hi = 100, .lo_open = true}, &B::dry_base, 1.75),
    D::integer("dry_allowed_length", kInGeneration, dry_length_range, &B::dry_allowed_length, 2),
    D::integer("dry_penalty_last_n", kInGeneration, dry_last_n_range, &B::dry_penalty_last_n, -1),
    D::any("dry_sequence_breakers", kInGeneration).then(read_dry_breakers),
    D::object("logit_bias", kInGeneration).then(read_logit_bias),
    // Read, not kept.
    D::boolean("store", kInGeneration),
    D::object("metadata", kInGeneration),
    // Accepted only where they ask for nothing kvvm lacks.
    D::string("suffix", kInCompletions).only(is_empty_string, "no text insertion; omit it"),
    D::array("tools", kInChat | kInTokenize, &B::tools),
    D::string_or_object("tool_choice", kInChat, &B::tool_choice),
    D::array("functions", kInChat, &B::functions),
    D::string_or_object("function_call", kInChat, &B::function_call),
    D::boolean("parallel_tool_calls", kInChat, &B::parallel_tool_calls, true),
    D::object("chat_template_kwargs", kInChat | kInTokenize, &B::chat_template_kwargs),
    D::array("documents", kInChat | kInTokenize, &B::documents),
    D::boolean("continue_final_message", kInChat | kInTokenize, &B::continue_final_message, false),
    D::any("audio", kInChat).only(nullptr, "text output only"),
    D::array("modalities", kInChat)
        .only(is_text_only, "text output only; send [\"text\"] or omit it"),
    // Structured output: at most one constraint, read by structured_output.cc. kvvm's own
    // grammar engine serves whatever backend is named; its JSON whitespace is compact, so a
    // whitespace pattern is refused rather than ignored.
    D::object("response_format", kInGeneration, &B::response_format),
    D::string_or_object("guided_json", kInGeneration, &B::guided_json),
    D::string("guided_regex", kInGeneration, &B::guided_regex),
    D::array("guided_choice", kInGeneration, &B::guided_choice),
    D::string("guided_grammar", kInGeneration, &B::guided_grammar),
    D::any("guided_whitespace_pattern", kInGeneration)
        .only(nullptr, "JSON whitespace is compact, none between tokens; omit it"),
    D::string("guided_decoding_backend", kInGeneration),
    D::object("structured_outputs", kInGeneration, &B::structured_outputs),
    // /tokenize: special tokens are added to a text prompt unless false (never to messages).
    D::boolean("add_special_tokens", kInTokenize, &B::add_special_tokens),
    D::boolean("add_generation_prompt", kInChat | kInTokenize, &B::add_generation_prompt, true),
    // /detokenize.
    D::array("tokens", kInDetokenize)
        .required_in(kInDetokenize)
        .described_as("an array of token ids")
        .then(read_token_ids),
};

}  // namespace

std::span<const Field<RequestBody>> request_fields() { return kFields; }

}  // namespace kvvm::server
