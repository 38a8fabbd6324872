#include "field_reader.h"

#include <cmath>
#include <cstdio>
#include <string>

namespace kvvm::server {

using nlohmann::json;

namespace {

// A bound as a person writes it: 2, -100, 0.5.
std::string bound_text(double bound) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", bound);
  return text;
}

Check check_number(const NumberRange& range, std::string_view param, const json& value,
                   FieldValue* out) {
  double v = 0;
  if (Check error = read_number(value, param, &v)) return error;
  const bool above_lo = range.lo_open ? v > range.lo : v >= range.lo;
  const bool below_hi = range.hi_open ? v < range.hi : v <= range.hi;
  if (!above_lo || !below_hi) {
    return bad_field(param, shown(value) + " is out of range " + (range.lo_open ? "(" : "[") +
                                bound_text(range.lo) + ", " + bound_text(range.hi) +
                                (range.hi_open ? ")" : "]"));
  }
  *out = v;
  return std::nullopt;
}

// The JSON kinds: the type only; the value stays where it is.
Check check_kind(const ValueRule& rule, std::string_view param, const json& value) {
  const auto wanted = [&](std::string_view words) {
    return rule.wanted.empty() ? words : rule.wanted;
  };
  switch (rule.type) {
    case FieldType::kString:
      if (!value.is_string()) return bad_field(param, wrong_type(value, wanted("a string")));
      break;
    case FieldType::kObject:
      if (!value.is_object()) return bad_field(param, wrong_type(value, wanted("an object")));
      break;
    case FieldType::kArray:
      if (!value.is_array()) return bad_field(param, wrong_type(value, wanted("an array")));
      break;
    case FieldType::kStringOrObject:
      if (!value.is_string() && !value.is_object()) {
        return bad_field(param, wrong_type(value, wanted("a string or an object")));
      }
      break;
    default:
      break;
  }
  return std::nullopt;
}

}  // namespace

Check check_value(const ValueRule& rule, std::string_view param, const json& value,
                  const ParseContext& context, FieldValue* out) {
  *out = std::monostate{};
  switch (rule.type) {
    case FieldType::kBool: {
      bool v = false;
      if (Check error = read_bool(value, param, &v)) return error;
      *out = v;
      return std::nullopt;
    }
    case FieldType::kInteger: {
      const IntegerRange range = rule.integers(context);
      std::int64_t v = 0;
      if (Check error = read_integer(value, param, range.lo, range.hi, range.limit, &v)) {
        return error;
      }
      *out = v;
      return std::nullopt;
    }
    case FieldType::kSeed: {
      std::uint64_t v = 0;
      if (Check error = read_seed(value, param, &v)) return error;
      *out = v;
      return std::nullopt;
    }
    case FieldType::kNumber:
      return check_number(rule.numbers, param, value, out);
    default:
      return check_kind(rule, param, value);
  }
}

ApiError refuse_unsupported(std::string_view param, const json& value, std::string_view why) {
  return unsupported(param, shown(value) + " (" + std::string(why) + ")");
}

ApiError misdeclared(std::string_view param) {
  return error_of(500, "server_error",
                  std::string(param) + ": the server declares this field wrongly", "");
}

}  // namespace kvvm::server
