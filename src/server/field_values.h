// Reading one JSON value of a request body into a typed field: each reader returns the 400
// that names the field (its path in `param`, the value as the client wrote it, the limit), or
// nothing. The field reader's checks (field_reader.h), and those of values with an inner
// structure (prompts, messages, stop strings, logit_bias).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "api_error.h"

namespace kvvm::server {

// Every check returns the error it found, or nothing.
using Check = std::optional<ApiError>;

// What kvvm does not do, refused by name: never an "unknown field", so a client knows the
// server read the field and cannot honour it.
ApiError unsupported(std::string_view param, std::string_view what);
// The value as the client wrote it, shortened: for messages that name a bad value.
std::string shown(const nlohmann::json& value);
std::string type_name(const nlohmann::json& value);
// "must be <wanted>, not <type> <value>" ("not null" for a null).
std::string wrong_type(const nlohmann::json& value, std::string_view wanted);

// A JSON number (integer or float, never a boolean or a string) as a double.
Check read_number(const nlohmann::json& value, std::string_view param, double* out);
// An integer in [lo, hi]: a JSON integer, or a float with no fraction (16.0), as the OpenAI
// server takes them. `limit` says where the bounds come from.
Check read_integer(const nlohmann::json& value, std::string_view param, std::int64_t lo,
                   std::int64_t hi, std::string_view limit, std::int64_t* out);
// Any 64-bit signed or unsigned integer, folded into the sampler's uint64 (two's complement).
Check read_seed(const nlohmann::json& value, std::string_view param, std::uint64_t* out);
Check read_bool(const nlohmann::json& value, std::string_view param, bool* out);

}  // namespace kvvm::server
