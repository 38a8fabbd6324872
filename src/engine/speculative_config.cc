// SpeculativeOptions: their check, and vLLM's --speculative-config JSON read into them.
#include <nlohmann/json.hpp>
#include <string>

#include "kvvm/engine/engine.h"
#include "ngram_proposer.h"

namespace kvvm::engine {

Status check_speculative_options(const SpeculativeOptions& options) {
  if (!options.enabled()) return Status::Ok();
  if (options.method == SpeculativeMethod::kDraftModel) {
    if (options.num_speculative_tokens > kNgramMaxSpeculativeTokens) {
      return Status::InvalidArgument(
          "draft_model num_speculative_tokens " + std::to_string(options.num_speculative_tokens) +
          ": outside [1, " + std::to_string(kNgramMaxSpeculativeTokens) + "]");
    }
    return Status::Ok();
  }
  return check_ngram_options(NgramOptions{.num_speculative_tokens = options.num_speculative_tokens,
                                          .prompt_lookup_min = options.prompt_lookup_min,
                                          .prompt_lookup_max = options.prompt_lookup_max});
}

Result<SpeculativeOptions> parse_speculative_config(const std::string& json) {
  const std::string what = "--speculative-config " + json;
  const nlohmann::json config = nlohmann::json::parse(json, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return Status::InvalidArgument(what + ": not a JSON object");
  }
  SpeculativeOptions options;
  bool min_given = false, max_given = false;
  std::string method;
  std::string lookup_key;  // a key of n-gram lookup, which a draft model refuses
  for (const auto& [key, value] : config.items()) {
    if (key == "method" || key == "model") {
      if (!value.is_string() || value.get<std::string>().empty()) {
        return Status::InvalidArgument(what + ": \"" + key + "\" is " + value.dump() +
                                       ", not a non-empty string");
      }
      (key == "method" ? method : options.draft_model) = value.get<std::string>();
      continue;
    }
    std::uint32_t* field = nullptr;
    if (key == "num_speculative_tokens") {
      field = &options.num_speculative_tokens;
    } else if (key == "prompt_lookup_min") {
      field = &options.prompt_lookup_min;
      min_given = true;
      lookup_key = key;
    } else if (key == "prompt_lookup_max") {
      field = &options.prompt_lookup_max;
      max_given = true;
      lookup_key = key;
    } else if (key == "disable_by_batch_size") {
      field = &options.disable_by_batch_size;
    } else {
      return Status::InvalidArgument(
          what + ": unknown key \"" + key +
          "\" (known: method, model, num_speculative_tokens, prompt_lookup_min, "
          "prompt_lookup_max, disable_by_batch_size)");
    }
    if (!value.is_number_unsigned() || value.get<std::uint64_t>() > 0xFFFFFFFFull) {
      return Status::InvalidArgument(what + ": \"" + key + "\" is " + value.dump() +
                                     ", not a whole number >= 0");
    }
    *field = value.get<std::uint32_t>();
  }
  // vLLM infers the method so.
  if (method.empty() && !options.draft_model.empty()) method = "draft_model";
  if (method.empty() && (min_given || max_given)) method = "ngram";
  if (method == "draft_model") {
    options.method = SpeculativeMethod::kDraftModel;
    if (options.draft_model.empty()) {
      return Status::InvalidArgument(what +
                                     ": method \"draft_model\" needs \"model\", the draft "
                                     "checkpoint's directory");
    }
    if (!lookup_key.empty()) {
      return Status::InvalidArgument(what + ": \"" + lookup_key +
                                     "\" is n-gram lookup's; a draft model proposes without it");
    }
  } else if (method != "ngram") {
    return Status::InvalidArgument(
        what + ": method \"" + method +
        "\" is not available; kvvm speculates by n-gram prompt lookup (\"ngram\") or a draft "
        "model (\"draft_model\" with \"model\"): EAGLE and MTP heads are not built");
  } else if (!options.draft_model.empty()) {
    return Status::InvalidArgument(what +
                                   ": \"model\" with method \"ngram\", which reads "
                                   "no model");
  }
  if (options.num_speculative_tokens == 0) {
    return Status::InvalidArgument(what + ": num_speculative_tokens is required, 1 to " +
                                   std::to_string(kNgramMaxSpeculativeTokens));
  }
  // One of the two alone sets both (vLLM's rule).
  if (min_given && !max_given) options.prompt_lookup_max = options.prompt_lookup_min;
  if (max_given && !min_given) options.prompt_lookup_min = options.prompt_lookup_max;
  KVVM_RETURN_IF_ERROR(check_speculative_options(options).with_context(what));
  return options;
}

}  // namespace kvvm::engine
