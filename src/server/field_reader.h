// The one reader of a request body's fields, by a table of declarations, the way vLLM declares
// its request models (pydantic): each field is one declaration (its name, the endpoints that
// accept it, its type, its range or the values it allows, its default, and where its value
// goes), so a new API field is a line in the table (request_fields.cc), not a parser's branch.
// Declare<Body> writes a declaration by its type; the rest reads and checks a table.
//
// What the reader does with each key of a body (or of an object field's value):
// - a key no declaration of this endpoint names is ignored and reported by its path
//   ("temprature", "stream_options.x"), as OpenAI's and vLLM's servers do: SDKs and
//   frameworks send fields of newer API versions routinely;
// - null is the default, as OpenAI reads it; so is an absent key;
// - a value the declaration calls neutral is accepted and changes nothing;
// - otherwise the type, then the range, is checked, and a declaration that names what is
//   unsupported refuses every other value as not supported (a 400 naming field and value);
// - the value goes into the body struct; then the declaration's own `read` runs (values with
//   an inner structure: stop strings, logit_bias) and an object's own fields are read the same
//   way.
// A field the endpoint requires and the body lacks is refused ("is required") once every key
// is read. The first error ends the reading.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "field_values.h"
#include "kvvm/base/status.h"
#include "openai_request.h"

namespace kvvm::server {

// The endpoints whose bodies the table describes, as bits: a declaration names every one that
// accepts its field; anywhere else the field is unknown.
enum EndpointBits : std::uint8_t {
  kInCompletions = 1,
  kInChat = 2,
  kInTokenize = 4,
  kInDetokenize = 8,
  kInGeneration = kInCompletions | kInChat,
  kInEvery = kInGeneration | kInTokenize | kInDetokenize,
};

constexpr std::uint8_t endpoint_bit(Endpoint endpoint) {
  return endpoint == Endpoint::kChat ? kInChat : kInCompletions;
}

enum class FieldType : std::uint8_t {
  kBool,            // true or false
  kInteger,         // a JSON integer, or a float with no fraction (16.0), in `integers`
  kNumber,          // an integer or a float (never a boolean or a string) in `numbers`
  kSeed,            // any 64-bit integer, signed or unsigned, folded into uint64
  kString,          // kept as a string, or as JSON
  kObject,          // kept as JSON, read by `read` or by `fields`
  kArray,           // kept as JSON, read by `read`
  kStringOrObject,  // kept as JSON
  kAny,             // any JSON: `read`, or a reader after the table's, checks it
};

// A number's bounds, each closed or open: (0, 1] is {.lo = 0, .hi = 1, .lo_open = true}.
struct NumberRange {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;
};

// An integer's bounds and, for the message, where they come from (" (the server's --max-n)").
struct IntegerRange {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  std::string limit;
};
// From the server's context: some bounds are its settings (the context's size, --max-n).
using IntegerBounds = IntegerRange (*)(const ParseContext& context);

// A checked scalar (kBool, kInteger, kSeed, kNumber), or a declared default; monostate: none,
// the slot's empty value.
using FieldValue = std::variant<std::monostate, bool, std::int64_t, std::uint64_t, double>;

// Where a field's value goes in the body struct; monostate: read and checked, not kept. A JSON
// slot keeps the value itself (it lives as long as the parsed body).
template <typename Body>
using Slot =
    std::variant<std::monostate, bool Body::*, std::optional<bool> Body::*, std::int64_t Body::*,
                 std::optional<std::int64_t> Body::*, std::uint64_t Body::*, double Body::*,
                 std::string Body::*, const nlohmann::json * Body::*>;

using IsNeutral = bool (*)(const nlohmann::json& value);

template <typename Body>
struct Field {
  using Read = Check (*)(const nlohmann::json& value, std::string_view param,
                         const ParseContext& context, Body* body);

  std::string_view name;
  std::uint8_t in = 0;        // EndpointBits: the endpoints that accept it
  std::uint8_t required = 0;  // EndpointBits: those that refuse a body without it
  FieldType type = FieldType::kAny;
  Slot<Body> into;
  FieldValue fallback;               // absent or null: this value
  NumberRange numbers;               // kNumber
  IntegerBounds integers = nullptr;  // kInteger
  // The type in words where the type's own say too little ("an array of token ids").
  std::string_view wanted;
  // A value accepted and ignored (logprobs false, suffix ""): the default stays.
  IsNeutral neutral = nullptr;
  // Set: every value that is not neutral is refused as not supported, this the reason.
  std::string_view unsupported;
  Read read = nullptr;            // runs once the value is checked and kept
  std::span<const Field> fields;  // kObject: the object's own fields, read the same way

  // What a declaration adds to its type's (Declare below), one call each.
  constexpr Field required_in(std::uint8_t endpoints) const {
    Field field = *this;
    field.required = endpoints;
    return field;
  }
  constexpr Field neutral_if(IsNeutral is_neutral) const {
    Field field = *this;
    field.neutral = is_neutral;
    return field;
  }
  // Only the neutral value (none: no value at all) is taken; any other is not supported.
  constexpr Field only(IsNeutral is_neutral, std::string_view why) const {
    Field field = neutral_if(is_neutral);
    field.unsupported = why;
    return field;
  }
  constexpr Field then(Read run) const {
    Field field = *this;
    field.read = run;
    return field;
  }
  constexpr Field with_fields(std::span<const Field> inner) const {
    Field field = *this;
    field.fields = inner;
    return field;
  }
  constexpr Field described_as(std::string_view words) const {
    Field field = *this;
    field.wanted = words;
    return field;
  }
};

// The declarations of a Body's fields by type: the name, the endpoints that accept it, the
// range, where the value goes (none: checked, not kept) and the default (none: the slot's
// empty value).
template <typename Body>
struct Declare {
  static constexpr Field<Body> boolean(std::string_view name, std::uint8_t in, Slot<Body> into = {},
                                       std::optional<bool> fallback = std::nullopt) {
    return make(name, in, FieldType::kBool, into, fallback);
  }
  static constexpr Field<Body> integer(std::string_view name, std::uint8_t in, IntegerBounds bounds,
                                       Slot<Body> into = {},
                                       std::optional<std::int64_t> fallback = std::nullopt) {
    Field<Body> field = make(name, in, FieldType::kInteger, into, fallback);
    field.integers = bounds;
    return field;
  }
  static constexpr Field<Body> number(std::string_view name, std::uint8_t in, NumberRange range,
                                      Slot<Body> into = {},
                                      std::optional<double> fallback = std::nullopt) {
    Field<Body> field = make(name, in, FieldType::kNumber, into, fallback);
    field.numbers = range;
    return field;
  }
  static constexpr Field<Body> seed(std::string_view name, std::uint8_t in, Slot<Body> into,
                                    std::optional<std::uint64_t> fallback = std::nullopt) {
    return make(name, in, FieldType::kSeed, into, fallback);
  }
  static constexpr Field<Body> string(std::string_view name, std::uint8_t in,
                                      Slot<Body> into = {}) {
    return make(name, in, FieldType::kString, into, std::optional<bool>());
  }
  static constexpr Field<Body> object(std::string_view name, std::uint8_t in,
                                      Slot<Body> into = {}) {
    return make(name, in, FieldType::kObject, into, std::optional<bool>());
  }
  static constexpr Field<Body> array(std::string_view name, std::uint8_t in, Slot<Body> into = {}) {
    return make(name, in, FieldType::kArray, into, std::optional<bool>());
  }
  static constexpr Field<Body> string_or_object(std::string_view name, std::uint8_t in,
                                                Slot<Body> into = {}) {
    return make(name, in, FieldType::kStringOrObject, into, std::optional<bool>());
  }
  static constexpr Field<Body> any(std::string_view name, std::uint8_t in, Slot<Body> into = {}) {
    return make(name, in, FieldType::kAny, into, std::optional<bool>());
  }

 private:
  template <typename T>
  static constexpr Field<Body> make(std::string_view name, std::uint8_t in, FieldType type,
                                    Slot<Body> into, std::optional<T> fallback) {
    Field<Body> field;
    field.name = name;
    field.in = in;
    field.type = type;
    field.into = into;
    if (fallback) field.fallback = *fallback;
    return field;
  }
};

// The checks a declaration asks of a value: its type, then its range; the scalar read into
// `out` (monostate for strings and JSON kinds).
struct ValueRule {
  FieldType type = FieldType::kAny;
  NumberRange numbers;
  IntegerBounds integers = nullptr;
  std::string_view wanted;
};
Check check_value(const ValueRule& rule, std::string_view param, const nlohmann::json& value,
                  const ParseContext& context, FieldValue* out);
// 400 "<param>: <value> (<why>) is not supported by this server".
ApiError refuse_unsupported(std::string_view param, const nlohmann::json& value,
                            std::string_view why);
// A declaration whose slot cannot hold its type: the table's mistake, never the client's.
ApiError misdeclared(std::string_view param);

namespace field_reader_detail {

template <typename T>
struct Unwrapped {
  using type = T;
};
template <typename T>
struct Unwrapped<std::optional<T>> {
  using type = T;
};

// `value` (monostate: the slot's empty value) into `member`; a string or JSON slot takes `raw`.
// False: a value of another type than the slot's.
template <typename Body, typename T>
bool store(T Body::*member, const FieldValue& value, const nlohmann::json* raw, Body* body) {
  T& slot = body->*member;
  if constexpr (std::is_same_v<T, const nlohmann::json*>) {
    slot = raw;
    return std::holds_alternative<std::monostate>(value);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (raw != nullptr && !raw->is_string()) return false;
    slot = raw != nullptr ? raw->get<std::string>() : std::string();
    return std::holds_alternative<std::monostate>(value);
  } else {
    if (std::holds_alternative<std::monostate>(value)) {
      slot = T{};
      return raw == nullptr;
    }
    const auto* v = std::get_if<typename Unwrapped<T>::type>(&value);
    if (v == nullptr) return false;
    slot = *v;
    return true;
  }
}

template <typename Body>
bool store(const Slot<Body>& slot, const FieldValue& value, const nlohmann::json* raw, Body* body) {
  return std::visit(
      [&](const auto& member) {
        if constexpr (std::is_same_v<std::decay_t<decltype(member)>, std::monostate>) {
          return true;
        } else {
          return store(member, value, raw, body);
        }
      },
      slot);
}

template <typename Body>
const Field<Body>* find(std::span<const Field<Body>> fields, std::uint8_t endpoint,
                        std::string_view key) {
  for (const Field<Body>& field : fields) {
    if ((field.in & endpoint) != 0 && field.name == key) return &field;
  }
  return nullptr;
}

template <typename Body>
bool apply_defaults(std::span<const Field<Body>> fields, std::uint8_t endpoint, Body* body) {
  for (const Field<Body>& field : fields) {
    if ((field.in & endpoint) == 0) continue;
    if (!store(field.into, field.fallback, nullptr, body)) return false;
    if (!apply_defaults(field.fields, endpoint, body)) return false;
  }
  return true;
}

template <typename Body>
Check read_keys(std::span<const Field<Body>> fields, std::uint8_t endpoint,
                const nlohmann::json& object, const std::string& prefix,
                const ParseContext& context, Body* body, std::vector<std::string>* ignored) {
  for (const auto& [key, value] : object.items()) {
    const std::string param = prefix + key;
    const Field<Body>* field = find(fields, endpoint, key);
    if (field == nullptr) {
      ignored->push_back(param);
      continue;
    }
    if (value.is_null()) continue;
    if (field->neutral != nullptr && field->neutral(value)) continue;
    FieldValue checked;
    const ValueRule rule{field->type, field->numbers, field->integers, field->wanted};
    if (Check error = check_value(rule, param, value, context, &checked)) return error;
    if (!field->unsupported.empty()) return refuse_unsupported(param, value, field->unsupported);
    if (!store(field->into, checked, &value, body)) return misdeclared(param);
    if (field->read != nullptr) {
      if (Check error = field->read(value, param, context, body)) return error;
    }
    if (!field->fields.empty()) {
      if (Check error =
              read_keys(field->fields, endpoint, value, param + ".", context, body, ignored)) {
        return error;
      }
    }
  }
  for (const Field<Body>& field : fields) {
    if ((field.required & endpoint) == 0) continue;
    const auto it = object.find(field.name);
    if (it == object.end() || it->is_null()) {
      return bad_field(prefix + std::string(field.name), "is required");
    }
  }
  return std::nullopt;
}

}  // namespace field_reader_detail

// Reads `object` (a JSON object) into `body` by `fields`, for `endpoint` (one EndpointBits
// bit): every accepted field's default first, then every key. The names of keys it does not
// know are appended to `ignored`.
template <typename Body>
Check read_fields(std::span<const Field<Body>> fields, std::uint8_t endpoint,
                  const nlohmann::json& object, const ParseContext& context, Body* body,
                  std::vector<std::string>* ignored) {
  if (!field_reader_detail::apply_defaults(fields, endpoint, body)) return misdeclared("default");
  return field_reader_detail::read_keys(fields, endpoint, object, "", context, body, ignored);
}

// What a table must hold for the reader to be right: each slot can take its field's type,
// each default is a value of the slot's type that passes its own field's checks, and no name
// is declared twice for one endpoint. The first mistake, named; OK when none.
template <typename Body>
Status check_declarations(std::span<const Field<Body>> fields, const ParseContext& context) {
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const Field<Body>& field = fields[i];
    const std::string name(field.name);
    for (std::size_t j = 0; j < i; ++j) {
      if ((fields[j].in & field.in) != 0 && fields[j].name == field.name) {
        return Status::InvalidArgument(name + ": declared twice for one endpoint");
      }
    }
    if ((field.required & ~field.in) != 0) {
      return Status::InvalidArgument(name + ": required where it is not accepted");
    }
    // A value of the field's type, as the reader would keep it.
    nlohmann::json sample;
    FieldValue typed;
    switch (field.type) {
      case FieldType::kBool:
        sample = false;
        typed = false;
        break;
      case FieldType::kInteger:
        if (field.integers == nullptr) return Status::InvalidArgument(name + ": no bounds");
        sample = field.integers(context).lo;
        typed = field.integers(context).lo;
        break;
      case FieldType::kSeed:
        sample = 0;
        typed = std::uint64_t{0};
        break;
      case FieldType::kNumber:
        sample = 0.5;
        typed = 0.5;
        break;
      case FieldType::kString:
        sample = "";
        break;
      default:
        sample = nlohmann::json::object();
        break;
    }
    Body body{};
    if (!field_reader_detail::store(field.into, typed, &sample, &body)) {
      return Status::InvalidArgument(name + ": its slot cannot hold its type");
    }
    if (Status nested = check_declarations(field.fields, context); !nested.ok()) {
      return nested.with_context(name);
    }
    if (std::holds_alternative<std::monostate>(field.fallback)) continue;
    if (!field_reader_detail::store(field.into, field.fallback, nullptr, &body)) {
      return Status::InvalidArgument(name + ": its default is not of its slot's type");
    }
    nlohmann::json fallback;
    std::visit(
        [&](const auto& v) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(v)>, std::monostate>) fallback = v;
        },
        field.fallback);
    FieldValue checked;
    const ValueRule rule{field.type, field.numbers, field.integers, field.wanted};
    if (Check error = check_value(rule, name, fallback, context, &checked)) {
      return Status::InvalidArgument("its default fails its own check: " + error->message);
    }
  }
  return Status::Ok();
}

}  // namespace kvvm::server
