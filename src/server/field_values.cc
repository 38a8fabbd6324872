#include "field_values.h"

#include <cmath>
#include <string>

namespace kvvm::server {

using nlohmann::json;

// What kvvm does not do, refused by name: never an "unknown field", so a client knows the
// server read the field and cannot honour it.
ApiError unsupported(std::string_view param, std::string_view what) {
  return bad_field(param, std::string(what) + " is not supported by this server");
}

// The value as the client wrote it, shortened: for messages that name a bad value.
std::string shown(const json& value) {
  constexpr std::size_t kMaxShown = 64;
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown) + "...";
  return text;
}

std::string type_name(const json& value) { return value.type_name(); }

std::string wrong_type(const json& value, std::string_view wanted) {
  std::string text = "must be " + std::string(wanted) + ", not " + type_name(value);
  // A null is its type's only value: "not null", never "not null null".
  if (!value.is_null()) text += " " + shown(value);
  return text;
}

// A JSON number (integer or float, never a boolean or a string) as a double.
Check read_number(const json& value, std::string_view param, double* out) {
  if (!value.is_number()) return bad_field(param, wrong_type(value, "a number"));
  *out = value.get<double>();
  return std::nullopt;
}

// An integer in [lo, hi]: a JSON integer, or a float with no fraction (16.0), as the
// OpenAI server takes them. `limit` says where the bounds come from.
Check read_integer(const json& value, std::string_view param, std::int64_t lo, std::int64_t hi,
                   std::string_view limit, std::int64_t* out) {
  if (!value.is_number()) return bad_field(param, wrong_type(value, "an integer"));
  const std::string range =
      "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]" + std::string(limit);
  if (value.is_number_unsigned()) {
    const std::uint64_t v = value.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(hi)) {
      return bad_field(param, std::to_string(v) + " is out of range " + range);
    }
    *out = static_cast<std::int64_t>(v);
  } else if (value.is_number_integer()) {
    *out = value.get<std::int64_t>();
  } else {
    const double v = value.get<double>();
    if (std::floor(v) != v) return bad_field(param, shown(value) + " is not an integer");
    // Compared as doubles: a value past int64 (1e30, 2^64) must not reach the cast.
    if (v < static_cast<double>(lo) || v > static_cast<double>(hi)) {
      return bad_field(param, shown(value) + " is out of range " + range);
    }
    *out = static_cast<std::int64_t>(v);
  }
  if (*out < lo || *out > hi) {
    return bad_field(param, std::to_string(*out) + " is out of range " + range);
  }
  return std::nullopt;
}

// Any 64-bit signed or unsigned integer, folded into the sampler's uint64 (two's complement).
Check read_seed(const json& value, std::string_view param, std::uint64_t* out) {
  if (!value.is_number()) return bad_field(param, wrong_type(value, "an integer"));
  if (value.is_number_unsigned()) {
    *out = value.get<std::uint64_t>();
  } else if (value.is_number_integer()) {
    *out = static_cast<std::uint64_t>(value.get<std::int64_t>());
  } else {
    const double v = value.get<double>();
    constexpr double kTwo63 = 9223372036854775808.0;
    if (std::floor(v) != v) return bad_field(param, shown(value) + " is not an integer");
    if (v < -kTwo63 || v >= 2 * kTwo63) {
      return bad_field(param, shown(value) + " is out of the 64-bit integer range");
    }
    *out = v < 0 ? static_cast<std::uint64_t>(static_cast<std::int64_t>(v))
                 : static_cast<std::uint64_t>(v);
  }
  return std::nullopt;
}

Check read_bool(const json& value, std::string_view param, bool* out) {
  if (!value.is_boolean()) return bad_field(param, wrong_type(value, "true or false"));
  *out = value.get<bool>();
  return std::nullopt;
}

}  // namespace kvvm::server
