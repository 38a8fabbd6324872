// tokenizer_config.json's add_bos_token / add_eos_token.
//
// What transformers does with them (read in its source, 4.x and 5.x): the flags reach the
// tokenizer's __init__, and a class that honours them rebuilds the post-processor from them
// alone: "[bos] $A [eos]", each side present when its flag is true (4.x: LlamaTokenizerFast,
// GemmaTokenizerFast and kin, add_bos defaulting to true there; 5.x: every TokenizersBackend,
// through update_post_processor, an absent flag counting false). So a flag set to true adds
// the token once even where tokenizer.json's template already adds it, and a flag set to false
// removes it even where the template adds it. kvvm does the same for a flag the config sets.
// Two differences, both chosen: an absent flag keeps tokenizer.json's side as it is (rather
// than a class's default), and the flags count even beside a tokenizer.json; transformers 5's
// from_pretrained drops both keys when a tokenizer.json is present (they then change nothing
// unless passed to from_pretrained as arguments, which is how scripts/
// make_tokenizer_fixtures.py asks transformers for the ids the tests compare with).
#include "tokenizer/tokenizer_config.h"

#include <optional>

namespace kvvm::tokenizer::detail {
namespace {

// bos_token / eos_token: a string or {"content": string, ...} (an AddedToken as saved).
Result<std::optional<std::string>> token_member(const Json& config, std::string_view key,
                                                std::string_view where) {
  const Json* value = find_member(config, key);
  if (value == nullptr) return std::optional<std::string>();
  if (value->is_string()) return std::optional<std::string>(value->get<std::string>());
  if (value->is_object()) {
    KVVM_ASSIGN_OR_RETURN(std::string content,
                          string_member(*value, "content", member_path(where, key)));
    return std::optional<std::string>(std::move(content));
  }
  return field_error(member_path(where, key),
                     "expected a string or {\"content\": string}, found " + json_kind(*value));
}

// The id of the token `name_key` names, for the flag `flag_key`.
Result<TokenId> flag_token(const Json& config, std::string_view flag_key, std::string_view name_key,
                           std::string_view where, const TokenizerParts& parts) {
  KVVM_ASSIGN_OR_RETURN(std::optional<std::string> name, token_member(config, name_key, where));
  if (!name.has_value()) {
    return field_error(member_path(where, flag_key),
                       "true, but " + std::string(name_key) + " names no token");
  }
  const std::string& content = *name;
  if (const auto found = parts.added_ids.find(content); found != parts.added_ids.end()) {
    return found->second;
  }
  if (const TokenId id = parts.model->vocab().find(content); id >= 0) return id;
  // transformers would add it as a new token with a new id, which the model has no row for.
  return field_error(member_path(where, name_key),
                     "'" + content + "' is neither in the vocab nor an added token");
}

}  // namespace

Status apply_config_flags(const Json& config, std::string_view where, TokenizerParts& parts) {
  if (!config.is_object()) {
    return field_error(where, "expected an object, found " + json_kind(config));
  }
  const struct {
    const char* flag;
    const char* name;
    std::vector<TokenId>* side;
  } sides[] = {{"add_bos_token", "bos_token", &parts.post_processor.prefix},
               {"add_eos_token", "eos_token", &parts.post_processor.suffix}};
  for (const auto& side : sides) {
    const Json* flag = find_member(config, side.flag);
    if (flag == nullptr) continue;
    if (!flag->is_boolean()) {
      return field_error(member_path(where, side.flag),
                         "expected a boolean, found " + json_kind(*flag));
    }
    if (!flag->get<bool>()) {
      side.side->clear();
      continue;
    }
    KVVM_ASSIGN_OR_RETURN(TokenId id, flag_token(config, side.flag, side.name, where, parts));
    *side.side = {id};
  }
  return Status::Ok();
}

}  // namespace kvvm::tokenizer::detail
