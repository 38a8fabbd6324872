#include "choice_fields.h"

#include <string>
#include <utility>
#include <vector>

namespace kvvm::server {

using nlohmann::json;

namespace {

constexpr std::size_t kMaxLogitBias = 1024;

// logit_bias: {"<token id>": bias in [-100, 100]}, ids of the vocabulary.
Check read_logit_bias(const json& value, const ParseContext& context,
                      std::vector<std::pair<std::int32_t, float>>* out) {
  const std::string key = "logit_bias";
  if (!value.is_object()) return bad_field(key, wrong_type(value, "an object"));
  if (value.size() > kMaxLogitBias) {
    return bad_field(
        key, std::to_string(value.size()) + " entries; at most " + std::to_string(kMaxLogitBias));
  }
  for (const auto& [id_text, bias] : value.items()) {
    const std::string param = key + "." + id_text;
    std::int64_t id = -1;
    const bool digits = !id_text.empty() && id_text.size() <= 10 &&
                        id_text.find_first_not_of("0123456789") == std::string::npos;
    if (digits) id = std::stoll(id_text);
    if (id < 0 || id >= static_cast<std::int64_t>(context.vocab_size)) {
      return bad_field(param, "\"" + id_text + "\" is not a token id of the vocabulary [0, " +
                                  std::to_string(context.vocab_size) + ")");
    }
    double v = 0;
    if (Check error = read_number(bias, param, &v)) return error;
    if (v < -100 || v > 100) return bad_field(param, shown(bias) + " is out of range [-100, 100]");
    out->emplace_back(static_cast<std::int32_t>(id), static_cast<float>(v));
  }
  return std::nullopt;
}

}  // namespace

// The penalties and logit_bias: transforms of the logits before each draw.
Check read_penalty_field(const std::string& key, const json& value, const ParseContext& context,
                         ApiRequest* request) {
  model::SamplingParams& sampling = request->engine.sampling;
  if (key == "logit_bias") return read_logit_bias(value, context, &request->engine.logit_bias);
  if (key == "min_tokens") {
    std::int64_t v = 0;
    const std::string limit = " (the context holds " + std::to_string(context.context_tokens) + ")";
    if (Check error = read_integer(value, key, 0, context.context_tokens, limit, &v)) return error;
    request->engine.min_tokens = static_cast<std::uint32_t>(v);
    return std::nullopt;
  }
  double v = 0;
  if (Check error = read_number(value, key, &v)) return error;
  if (key == "repetition_penalty") {
    if (!(v > 0 && v <= 10)) return bad_field(key, shown(value) + " is out of range (0, 10]");
    sampling.repetition_penalty = static_cast<float>(v);
    return std::nullopt;
  }
  if (v < -2 || v > 2) return bad_field(key, shown(value) + " is out of range [-2, 2]");
  (key == "presence_penalty" ? sampling.presence_penalty : sampling.frequency_penalty) =
      static_cast<float>(v);
  return std::nullopt;
}

bool is_penalty_field(const std::string& key) {
  return key == "presence_penalty" || key == "frequency_penalty" || key == "repetition_penalty" ||
         key == "min_tokens" || key == "logit_bias";
}

// n, best_of, logprobs, top_logprobs and echo: how many answers and what they report.
Check read_choice_field(Endpoint endpoint, const std::string& key, const json& value,
                        const ParseContext& context, ApiRequest* request, ChoiceFields* fields) {
  const std::string max_n = " (the server's --max-n)";
  const std::int64_t top = model::kMaxTopLogprobs;
  if (key == "n") return read_integer(value, key, 1, context.max_n, max_n, &fields->n);
  if (key == "best_of") {
    std::int64_t best_of = 0;
    if (Check error = read_integer(value, key, 1, context.max_n, max_n, &best_of)) return error;
    fields->best_of = best_of;
    return std::nullopt;
  }
  if (key == "echo") return read_bool(value, key, &request->echo);
  if (key == "top_logprobs") {
    std::int64_t k = 0;
    if (Check error = read_integer(value, key, 0, top, "", &k)) return error;
    fields->top_logprobs = k;
    return std::nullopt;
  }
  // logprobs: chat's is whether to report them, completions' how many alternatives (false,
  // as some clients write "none", is taken as none).
  if (endpoint == Endpoint::kChat) return read_bool(value, key, &fields->chat_logprobs);
  if (value == false) return std::nullopt;
  std::int64_t k = 0;
  if (Check error = read_integer(value, key, 0, top, " (alternatives per token)", &k)) {
    return error;
  }
  request->engine.logprobs = static_cast<std::uint32_t>(k);
  return std::nullopt;
}

bool is_choice_field(const std::string& key) {
  return key == "n" || key == "best_of" || key == "echo" || key == "logprobs" ||
         key == "top_logprobs";
}

// What the choice fields mean together: best_of other than n drops choices, which kvvm does
// not do; chat's top_logprobs needs logprobs, as OpenAI requires.
Check settle_choice_fields(Endpoint endpoint, const ChoiceFields& fields, ApiRequest* request) {
  if (fields.best_of && *fields.best_of != fields.n) {
    return unsupported("best_of", std::to_string(*fields.best_of) + " with n " +
                                      std::to_string(fields.n) +
                                      " (choosing the best of several; send n alone)");
  }
  request->engine.n = static_cast<std::uint32_t>(fields.n);
  if (endpoint == Endpoint::kChat) {
    if (fields.top_logprobs && *fields.top_logprobs > 0 && !fields.chat_logprobs) {
      return bad_field("top_logprobs", "needs logprobs: true");
    }
    if (fields.chat_logprobs) {
      request->engine.logprobs = static_cast<std::uint32_t>(fields.top_logprobs.value_or(0));
    }
  }
  // Echo with log-probabilities reports the prompt's too (what scoring harnesses read).
  request->engine.prompt_logprobs = request->echo && request->engine.logprobs.has_value();
  return std::nullopt;
}

}  // namespace kvvm::server
