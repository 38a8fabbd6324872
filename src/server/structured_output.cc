#include "structured_output.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace kvvm::server {
namespace {

using grammar::Constraint;
using nlohmann::json;

// The JSON text of the value at `path` in the body with its keys in the order the client wrote
// them (a schema's properties are generated in that order); the reader's value, keys sorted,
// when the body cannot be read so.
std::string ordered_text(std::string_view raw_body, std::initializer_list<const char*> path,
                         const json& value) {
  const nlohmann::ordered_json root = nlohmann::ordered_json::parse(
      raw_body.begin(), raw_body.end(), nullptr, /*allow_exceptions=*/false);
  const nlohmann::ordered_json* at = &root;
  for (const char* key : path) {
    if (!at->is_object()) return value.dump();
    const auto it = at->find(key);
    if (it == at->end()) return value.dump();
    at = &*it;
  }
  return at->dump();
}

// The value of `key` in `object`, null counted as absent (as the table reads null).
const json* member(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

// An object's keys other than `known` (null values aside) are refused: near a constraint, an
// ignored key could leave the output unconstrained without the client knowing.
Check refuse_unknown_keys(const json& object, const std::string& prefix,
                          std::initializer_list<std::string_view> known, std::string_view owner) {
  for (const auto& [key, value] : object.items()) {
    if (value.is_null() || std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string names;
    for (std::string_view name : known) names += (names.empty() ? "" : ", ") + std::string(name);
    return bad_field(prefix + key, "is not a field of " + std::string(owner) + " kvvm knows (" +
                                       names + "); refused, not ignored");
  }
  return std::nullopt;
}

// OpenAI's rule for a json_schema's name.
bool is_schema_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-';
  });
}

// The constraints found so far: one at most.
class Found {
 public:
  // `name`: the field as the client sent it, for a second constraint's refusal; `field`: where
  // the constraint's text is, for its compile errors.
  Check add(std::string name, std::string field, Constraint constraint) {
    if (found_) {
      return bad_field(name, "one constraint per request: " + name_ + " and " + name +
                                 " both constrain the output; send one of them");
    }
    name_ = std::move(name);
    found_ = ConstraintRequest{std::move(constraint), std::move(field)};
    return std::nullopt;
  }
  std::optional<ConstraintRequest> take() { return std::move(found_); }

 private:
  std::string name_;
  std::optional<ConstraintRequest> found_;
};

Constraint of_kind(Constraint::Kind kind, std::string text = {}) {
  Constraint constraint;
  constraint.kind = kind;
  constraint.text = std::move(text);
  return constraint;
}

// choice lists: a non-empty array of non-empty strings.
Check read_choices(const json& value, const std::string& param, std::vector<std::string>* out) {
  if (!value.is_array()) return bad_field(param, wrong_type(value, "an array of strings"));
  if (value.empty()) return bad_field(param, "is empty; send at least one choice");
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::string item = param + "[" + std::to_string(i) + "]";
    if (!value[i].is_string()) return bad_field(item, wrong_type(value[i], "a string"));
    if (value[i].get_ref<const std::string&>().empty()) {
      return bad_field(item, "is empty; each choice must be at least one character");
    }
    out->push_back(value[i].get<std::string>());
  }
  return std::nullopt;
}

// A schema given as an object (its text in the client's key order) or as JSON text (as is: the
// compiler reads it and names what is wrong with it).
Check read_schema(const json& value, const std::string& param, std::string_view raw_body,
                  std::initializer_list<const char*> path, std::string* text) {
  if (value.is_string()) {
    *text = value.get<std::string>();
    if (text->empty()) return bad_field(param, "is empty; send a JSON Schema");
    return std::nullopt;
  }
  if (!value.is_object()) {
    return bad_field(param, wrong_type(value, "a JSON Schema (an object, or its JSON text)"));
  }
  *text = ordered_text(raw_body, path, value);
  return std::nullopt;
}

Check read_response_format(const json& format, std::string_view raw_body, Found* found) {
  if (Check error = refuse_unknown_keys(format, "response_format.", {"type", "json_schema"},
                                        "response_format")) {
    return error;
  }
  const json* type = member(format, "type");
  if (type == nullptr) return bad_field("response_format.type", "is required");
  if (!type->is_string()) return bad_field("response_format.type", wrong_type(*type, "a string"));
  const json* schema_format = member(format, "json_schema");
  if (*type != "json_schema") {
    if (*type != "text" && *type != "json_object") {
      return bad_field(
          "response_format.type",
          shown(*type) + " is not a response format: text, json_object or json_schema");
    }
    if (schema_format != nullptr) {
      return bad_field("response_format.json_schema",
                       "only with type \"json_schema\" (the type is " + shown(*type) + ")");
    }
    if (*type == "text") return std::nullopt;
    return found->add("response_format", "response_format", of_kind(Constraint::Kind::kJsonObject));
  }
  const std::string param = "response_format.json_schema";
  if (schema_format == nullptr) return bad_field(param, "is required with type \"json_schema\"");
  if (!schema_format->is_object()) return bad_field(param, wrong_type(*schema_format, "an object"));
  if (Check error = refuse_unknown_keys(*schema_format, param + ".",
                                        {"name", "description", "schema", "strict"}, param)) {
    return error;
  }
  const json* name = member(*schema_format, "name");
  if (name == nullptr) return bad_field(param + ".name", "is required");
  if (!name->is_string()) return bad_field(param + ".name", wrong_type(*name, "a string"));
  if (!is_schema_name(name->get_ref<const std::string&>())) {
    return bad_field(param + ".name",
                     shown(*name) + " must be 1 to 64 of a-z, A-Z, 0-9, _ and - (OpenAI's rule)");
  }
  if (const json* description = member(*schema_format, "description");
      description != nullptr && !description->is_string()) {
    return bad_field(param + ".description", wrong_type(*description, "a string"));
  }
  bool strict = false;
  if (const json* value = member(*schema_format, "strict")) {
    if (Check error = read_bool(*value, param + ".strict", &strict)) return error;
  }
  const json* schema = member(*schema_format, "schema");
  if (schema == nullptr) return bad_field(param + ".schema", "is required");
  if (!schema->is_object()) return bad_field(param + ".schema", wrong_type(*schema, "an object"));
  Constraint constraint =
      of_kind(Constraint::Kind::kJsonSchema,
              ordered_text(raw_body, {"response_format", "json_schema", "schema"}, *schema));
  constraint.strict = strict;
  return found->add("response_format", param + ".schema", std::move(constraint));
}

// vLLM's structured_outputs: one constraint, and the JSON options that apply to it.
Check read_structured_outputs(const json& outputs, std::string_view raw_body, Found* found) {
  const std::string prefix = "structured_outputs.";
  if (Check error =
          refuse_unknown_keys(outputs, prefix,
                              {"json", "regex", "choice", "grammar", "json_object",
                               "disable_any_whitespace", "disable_additional_properties",
                               "disable_fallback", "whitespace_pattern", "structural_tag"},
                              "structured_outputs")) {
    return error;
  }
  if (const json* value = member(outputs, "whitespace_pattern")) {
    return unsupported(prefix + "whitespace_pattern",
                       shown(*value) +
                           " (JSON whitespace is compact, or flexible with "
                           "disable_any_whitespace false; omit it)");
  }
  if (const json* value = member(outputs, "structural_tag")) {
    return unsupported(prefix + "structural_tag", shown(*value) + " (no structural tags)");
  }
  bool any_whitespace_disabled = true;  // kvvm's default: compact JSON
  bool additional_disabled = false;
  bool fallback_disabled = false;  // read only: kvvm never falls back, it compiles or refuses
  for (const auto& [key, out] : {std::pair{"disable_any_whitespace", &any_whitespace_disabled},
                                 std::pair{"disable_additional_properties", &additional_disabled},
                                 std::pair{"disable_fallback", &fallback_disabled}}) {
    if (const json* value = member(outputs, key)) {
      if (Check error = read_bool(*value, prefix + key, out)) return error;
    }
  }
  grammar::JsonWhitespace whitespace;
  whitespace.flexible = !any_whitespace_disabled;

  if (const json* value = member(outputs, "json")) {
    Constraint constraint = of_kind(Constraint::Kind::kJsonSchema);
    if (Check error = read_schema(*value, prefix + "json", raw_body, {"structured_outputs", "json"},
                                  &constraint.text)) {
      return error;
    }
    constraint.whitespace = whitespace;
    constraint.strict = additional_disabled;
    if (Check error = found->add(prefix + "json", prefix + "json", std::move(constraint))) {
      return error;
    }
  }
  for (const auto& [key, kind] : {std::pair{"regex", Constraint::Kind::kRegex},
                                  std::pair{"grammar", Constraint::Kind::kGbnf}}) {
    const json* value = member(outputs, key);
    if (value == nullptr) continue;
    if (!value->is_string()) return bad_field(prefix + key, wrong_type(*value, "a string"));
    if (Check error =
            found->add(prefix + key, prefix + key, of_kind(kind, value->get<std::string>()))) {
      return error;
    }
  }
  if (const json* value = member(outputs, "choice")) {
    Constraint constraint = of_kind(Constraint::Kind::kChoices);
    if (Check error = read_choices(*value, prefix + "choice", &constraint.choices)) return error;
    if (Check error = found->add(prefix + "choice", prefix + "choice", std::move(constraint))) {
      return error;
    }
  }
  if (const json* value = member(outputs, "json_object")) {
    bool wanted = false;
    if (Check error = read_bool(*value, prefix + "json_object", &wanted)) return error;
    if (wanted) {
      Constraint constraint = of_kind(Constraint::Kind::kJsonObject);
      constraint.whitespace = whitespace;
      if (Check error =
              found->add(prefix + "json_object", prefix + "json_object", std::move(constraint))) {
        return error;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

Check settle_structured_output(const RequestBody& body, std::string_view raw_body,
                               const std::vector<std::string>& ignored,
                               std::optional<ConstraintRequest>* out) {
  // A guided_* field kvvm does not know is a constraint it would otherwise drop unseen.
  for (const std::string& name : ignored) {
    if (name.starts_with("guided_") && name.find('.') == std::string::npos) {
      return bad_field(name,
                       "is not a guided decoding field kvvm knows (guided_json, guided_regex, "
                       "guided_choice, guided_grammar, guided_whitespace_pattern, "
                       "guided_decoding_backend); refused, not ignored");
    }
  }
  Found found;
  if (body.response_format != nullptr) {
    if (Check error = read_response_format(*body.response_format, raw_body, &found)) return error;
  }
  if (body.guided_json != nullptr) {
    Constraint constraint = of_kind(Constraint::Kind::kJsonSchema);
    if (Check error = read_schema(*body.guided_json, "guided_json", raw_body, {"guided_json"},
                                  &constraint.text)) {
      return error;
    }
    if (Check error = found.add("guided_json", "guided_json", std::move(constraint))) return error;
  }
  if (body.guided_regex != nullptr) {
    if (Check error =
            found.add("guided_regex", "guided_regex",
                      of_kind(Constraint::Kind::kRegex, body.guided_regex->get<std::string>()))) {
      return error;
    }
  }
  if (body.guided_choice != nullptr) {
    Constraint constraint = of_kind(Constraint::Kind::kChoices);
    if (Check error = read_choices(*body.guided_choice, "guided_choice", &constraint.choices)) {
      return error;
    }
    if (Check error = found.add("guided_choice", "guided_choice", std::move(constraint))) {
      return error;
    }
  }
  if (body.guided_grammar != nullptr) {
    if (Check error =
            found.add("guided_grammar", "guided_grammar",
                      of_kind(Constraint::Kind::kGbnf, body.guided_grammar->get<std::string>()))) {
      return error;
    }
  }
  if (body.structured_outputs != nullptr) {
    if (Check error = read_structured_outputs(*body.structured_outputs, raw_body, &found)) {
      return error;
    }
  }
  *out = found.take();
  return std::nullopt;
}

std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> compile_constraint(
    grammar::GrammarCache& cache, const ConstraintRequest& request) {
  Result<std::shared_ptr<const grammar::CompiledGrammar>> compiled = cache.get(request.constraint);
  if (compiled.ok()) return std::move(compiled).value();
  const Status& status = compiled.status();
  switch (status.code()) {
    // The client's constraint: malformed, unsupported, or past the grammar's bounds (a schema
    // bomb is the client's schema, named by the bound it ran into).
    case StatusCode::kInvalidArgument:
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:  // a kind of constraint this build cannot compile
      return bad_field(request.field, status.message());
    default:
      return error_of(500, "server_error",
                      request.field + ": compiling the constraint failed: " + status.to_string());
  }
}

}  // namespace kvvm::server
