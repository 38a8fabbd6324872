#include "tokenizer/post_processor.h"

namespace kvvm::tokenizer::detail {
namespace {

// The ids of the special token named `name` in the template's "special_tokens" map.
Result<std::vector<TokenId>> special_ids(const Json& processor, const std::string& name,
                                         std::string_view where) {
  const std::string map_where = member_path(where, "special_tokens");
  const Json* map = find_member(processor, "special_tokens");
  if (map == nullptr) return field_error(map_where, "missing");
  KVVM_RETURN_IF_ERROR(expect_object(*map, map_where));
  const Json* entry = find_member(*map, name);
  if (entry == nullptr) return field_error(map_where, "no entry for '" + name + "'");
  const std::string ids_where = member_path(map_where + "['" + name + "']", "ids");
  KVVM_RETURN_IF_ERROR(expect_object(*entry, map_where + "['" + name + "']"));
  const Json* ids = find_member(*entry, "ids");
  if (ids == nullptr) return field_error(ids_where, "missing");
  KVVM_RETURN_IF_ERROR(expect_array(*ids, ids_where));
  std::vector<TokenId> out;
  for (const Json& id : *ids) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
        id.get<std::int64_t>() > std::numeric_limits<TokenId>::max()) {
      return field_error(ids_where, "expected token ids, found " + json_kind(id));
    }
    out.push_back(static_cast<TokenId>(id.get<std::int64_t>()));
  }
  return out;
}

Result<PostProcessor> parse_template(const Json& json, std::string_view where) {
  const std::string single_where = member_path(where, "single");
  const Json* single = find_member(json, "single");
  if (single == nullptr) return field_error(single_where, "missing");
  KVVM_RETURN_IF_ERROR(expect_array(*single, single_where));
  PostProcessor out;
  bool seen_text = false;
  for (std::size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const std::string item_where = element_path(single_where, i);
    KVVM_RETURN_IF_ERROR(expect_object(item, item_where));
    if (const Json* special = find_member(item, "SpecialToken")) {
      KVVM_RETURN_IF_ERROR(expect_object(*special, member_path(item_where, "SpecialToken")));
      KVVM_ASSIGN_OR_RETURN(std::string name,
                            string_member(*special, "id", member_path(item_where, "SpecialToken")));
      KVVM_ASSIGN_OR_RETURN(std::vector<TokenId> ids, special_ids(json, name, where));
      auto& side = seen_text ? out.suffix : out.prefix;
      side.insert(side.end(), ids.begin(), ids.end());
    } else if (const Json* sequence = find_member(item, "Sequence")) {
      KVVM_RETURN_IF_ERROR(expect_object(*sequence, member_path(item_where, "Sequence")));
      KVVM_ASSIGN_OR_RETURN(std::string name,
                            string_member(*sequence, "id", member_path(item_where, "Sequence")));
      if (name != "A" || seen_text) {
        return field_error(item_where, "a single template holds $A once (found $" + name + ")");
      }
      seen_text = true;
    } else {
      return field_error(item_where, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
  }
  if (!seen_text) return field_error(single_where, "the template has no $A");
  return out;
}

}  // namespace

std::vector<TokenId> PostProcessor::apply(std::vector<TokenId> ids) const {
  if (prefix.empty() && suffix.empty()) return ids;
  std::vector<TokenId> out;
  out.reserve(prefix.size() + ids.size() + suffix.size());
  out.insert(out.end(), prefix.begin(), prefix.end());
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), suffix.begin(), suffix.end());
  return out;
}

Result<PostProcessor> parse_post_processor(const Json& json, std::string_view where) {
  if (json.is_null()) return PostProcessor{};
  KVVM_RETURN_IF_ERROR(expect_object(json, where));
  KVVM_ASSIGN_OR_RETURN(std::string type, type_member(json, where));
  if (type == "ByteLevel") return PostProcessor{};  // offsets only; the ids stay as they are
  if (type == "TemplateProcessing") return parse_template(json, where);
  if (type == "Sequence") {
    const std::string list_where = member_path(where, "processors");
    const Json* list = find_member(json, "processors");
    if (list == nullptr) return field_error(list_where, "missing");
    KVVM_RETURN_IF_ERROR(expect_array(*list, list_where));
    // Each step wraps what the one before it made.
    PostProcessor out;
    for (std::size_t i = 0; i < list->size(); ++i) {
      KVVM_ASSIGN_OR_RETURN(PostProcessor step,
                            parse_post_processor((*list)[i], element_path(list_where, i)));
      out.prefix.insert(out.prefix.begin(), step.prefix.begin(), step.prefix.end());
      out.suffix.insert(out.suffix.end(), step.suffix.begin(), step.suffix.end());
    }
    return out;
  }
  return field_error(member_path(where, "type"), "post-processor '" + type +
                                                     "' is not implemented (TemplateProcessing, "
                                                     "ByteLevel, Sequence or null are)");
}

}  // namespace kvvm::tokenizer::detail
