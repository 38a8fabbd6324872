#include "tokenizer/json_fields.h"

namespace kvvm::tokenizer::detail {

std::string json_kind(const Json& value) {
  if (value.is_number_integer()) return "integer " + value.dump();
  if (value.is_number()) return "number " + value.dump();
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    return "string '" + (text.size() > 64 ? text.substr(0, 64) + "..." : text) + "'";
  }
  return value.type_name();
}

Status field_error(std::string_view where, std::string_view message) {
  return Status::InvalidArgument(std::string(where) + ": " + std::string(message));
}

Status not_found(std::string_view message) {
  return Status::NotFound("not found: " + std::string(message));
}

std::string member_path(std::string_view where, std::string_view key) {
  return std::string(where) + "." + std::string(key);
}

std::string element_path(std::string_view where, std::size_t index) {
  return std::string(where) + "[" + std::to_string(index) + "]";
}

const Json* find_member(const Json& object, std::string_view key) {
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) return nullptr;
  return &*found;
}

Result<bool> bool_member(const Json& object, std::string_view key, bool fallback,
                         std::string_view where) {
  const Json* value = find_member(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) {
    return field_error(member_path(where, key), "expected a boolean, found " + json_kind(*value));
  }
  return value->get<bool>();
}

Result<std::string> string_member(const Json& object, std::string_view key,
                                  std::string_view where) {
  const Json* value = find_member(object, key);
  if (value == nullptr) return field_error(member_path(where, key), "missing");
  if (!value->is_string()) {
    return field_error(member_path(where, key), "expected a string, found " + json_kind(*value));
  }
  return value->get<std::string>();
}

Result<std::string> type_member(const Json& object, std::string_view where) {
  return string_member(object, "type", where);
}

Status expect_object(const Json& value, std::string_view where) {
  if (value.is_object()) return Status::Ok();
  return field_error(where, "expected an object, found " + json_kind(value));
}

Status expect_array(const Json& value, std::string_view where) {
  if (value.is_array()) return Status::Ok();
  return field_error(where, "expected an array, found " + json_kind(value));
}

}  // namespace kvvm::tokenizer::detail
