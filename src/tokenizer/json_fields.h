// Reading tokenizer.json's fields with errors that name the field's path ("model.merges[3]")
// and what was found there.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kvvm/base/status.h"

namespace kvvm::tokenizer::detail {

using Json = nlohmann::json;

// "string", "number", "null", ...: what a value was, for an error message.
std::string json_kind(const Json& value);

// InvalidArgument "<where>: <message>".
Status field_error(std::string_view where, std::string_view message);

// NotFound: an absent file or chat template.
Status not_found(std::string_view message);

// `where.key` (or `where[index]`): the path of a member, for messages.
std::string member_path(std::string_view where, std::string_view key);
std::string element_path(std::string_view where, std::size_t index);

// object[key] when it is present and not null; nullptr otherwise. `object` must be an object.
const Json* find_member(const Json& object, std::string_view key);

// A boolean member: `fallback` when absent or null, InvalidArgument when of another type.
Result<bool> bool_member(const Json& object, std::string_view key, bool fallback,
                         std::string_view where);
// A string member that must be present.
Result<std::string> string_member(const Json& object, std::string_view key, std::string_view where);
// The "type" member of a component, which must be a string.
Result<std::string> type_member(const Json& object, std::string_view where);

// Checks `value` is an object / array, naming `where` otherwise.
Status expect_object(const Json& value, std::string_view where);
Status expect_array(const Json& value, std::string_view where);

}  // namespace kvvm::tokenizer::detail
