// grammar_from_json_schema: parsing, the keyword tables, the walk over subschemas ($ref,
// combinators, enum/const, type) and the object and array grammars.
#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include "grammar/json_schema_compiler.h"
#include "tokenizer/utf8.h"

namespace kvvm::grammar {

namespace {

constexpr std::array<std::string_view, 10> kAnnotations = {
    "title", "description", "default",    "examples", "$schema",
    "$id",   "$comment",    "deprecated", "readOnly", "writeOnly"};
constexpr std::array<std::string_view, 28> kKeywords = {"type",
                                                        "properties",
                                                        "required",
                                                        "additionalProperties",
                                                        "minProperties",
                                                        "maxProperties",
                                                        "items",
                                                        "prefixItems",
                                                        "additionalItems",
                                                        "minItems",
                                                        "maxItems",
                                                        "uniqueItems",
                                                        "enum",
                                                        "const",
                                                        "anyOf",
                                                        "oneOf",
                                                        "allOf",
                                                        "$ref",
                                                        "minLength",
                                                        "maxLength",
                                                        "pattern",
                                                        "format",
                                                        "minimum",
                                                        "maximum",
                                                        "exclusiveMinimum",
                                                        "exclusiveMaximum",
                                                        "$defs",
                                                        "definitions"};

// The keywords that say which type an untyped schema is meant for.
constexpr std::array<std::string_view, 5> kObjectKeywords = {
    "properties", "required", "additionalProperties", "minProperties", "maxProperties"};
constexpr std::array<std::string_view, 6> kArrayKeywords = {
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"};
constexpr std::array<std::string_view, 4> kStringKeywords = {"minLength", "maxLength", "pattern",
                                                             "format"};
constexpr std::array<std::string_view, 4> kNumberKeywords = {
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
constexpr std::array<std::string_view, 7> kTypes = {"object", "array",   "string", "integer",
                                                    "number", "boolean", "null"};

template <std::size_t N>
bool has_any(const SchemaJson& s, const std::array<std::string_view, N>& keys) {
  for (std::string_view key : keys) {
    if (s.contains(std::string(key))) return true;
  }
  return false;
}

// Whether `value` is an instance of JSON Schema type `type` (1.0 counts as an integer).
bool is_of_type(const SchemaJson& value, std::string_view type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    if (value.is_number_integer()) return true;
    if (!value.is_number_float()) return false;
    const double v = value.get<double>();
    return std::isfinite(v) && std::floor(v) == v && std::abs(v) < 1e18;
  }
  return false;
}

// Brackets nested deeper than this are refused before parsing: a deeply nested text is cheap
// to send and costly to walk.
constexpr int kMaxTextDepth = 4 * kMaxSchemaDepth;

bool nests_too_deep(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxTextDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace

std::string shown_path(std::string_view path) { return path.empty() ? "/" : std::string(path); }

std::string child_path(std::string_view path, std::string_view key) {
  std::string out(path);
  out += '/';
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

bool is_annotation(std::string_view keyword) {
  return std::find(kAnnotations.begin(), kAnnotations.end(), keyword) != kAnnotations.end();
}

bool is_known_keyword(std::string_view keyword) {
  return is_annotation(keyword) ||
         std::find(kKeywords.begin(), kKeywords.end(), keyword) != kKeywords.end();
}

bool has_constraints(const SchemaJson& schema) {
  for (const auto& [key, value] : schema.items()) {
    if (!is_annotation(key) && key != "$defs" && key != "definitions") return true;
  }
  return false;
}

JsonSchemaCompiler::JsonSchemaCompiler(const SchemaJson& root, Grammar& grammar,
                                       const JsonSchemaOptions& options)
    : root_(root),
      grammar_(grammar),
      options_(options),
      b_(grammar, options.limits),
      json_(b_, options.whitespace) {}

Status JsonSchemaCompiler::depth_bound(const std::string& path, int depth) const {
  if (depth <= kMaxSchemaDepth) return Status::Ok();
  return Status::ResourceExhausted(
      concat("schema at ", shown_path(path), ": subschemas nest past the bound of ",
             kMaxSchemaDepth, " levels"),
      {static_cast<std::uint64_t>(depth), kMaxSchemaDepth, kMaxSchemaDepth});
}

Status JsonSchemaCompiler::compile() {
  const RuleId root = grammar_.declare("root");
  refs_[""] = root;
  KVVM_ASSIGN_OR_RETURN(Sequence top, schema(root_, "", 0));
  grammar_.define(root, {std::move(top)});
  // Targets of $ref, each compiled once, in the order they were first referenced.
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    const std::string pointer = pending_[i].first;
    const RuleId rule = pending_[i].second;
    KVVM_ASSIGN_OR_RETURN(const SchemaJson* target, resolve(SchemaJson("#" + pointer), pointer));
    KVVM_ASSIGN_OR_RETURN(Sequence body, schema(*target, pointer, 0));
    grammar_.define(rule, {std::move(body)});
    KVVM_RETURN_IF_ERROR(b_.check_size(concat("schema at ", shown_path(pointer))));
  }
  grammar_.set_root(root);
  KVVM_RETURN_IF_ERROR(b_.check_size("schema"));
  return grammar_.check(options_.limits);
}

Result<const SchemaJson*> JsonSchemaCompiler::resolve(const SchemaJson& ref,
                                                      const std::string& path) const {
  if (!ref.is_string()) return schema_error(path, "\"$ref\" is not a string");
  const std::string& text = ref.get_ref<const std::string&>();
  if (text.empty() || text[0] != '#') {
    return schema_error(path, "$ref \"", text,
                        "\" is not supported: only references within the schema (\"#...\")");
  }
  const SchemaJson* at = &root_;
  std::size_t pos = 1;
  if (pos < text.size() && text[pos] != '/') {
    return schema_error(path, "$ref \"", text,
                        "\" is not a JSON pointer (anchors are not supported)");
  }
  while (pos < text.size()) {
    const std::size_t next = std::min(text.find('/', pos + 1), text.size());
    std::string token;
    for (std::size_t i = pos + 1; i < next; ++i) {
      if (text[i] == '~' && i + 1 < next && (text[i + 1] == '0' || text[i + 1] == '1')) {
        token += text[i + 1] == '0' ? '~' : '/';
        ++i;
      } else if (text[i] == '%') {
        return schema_error(path, "$ref \"", text, "\": percent-encoding is not supported");
      } else {
        token += text[i];
      }
    }
    if (at->is_object() && at->contains(token)) {
      at = &(*at)[token];
    } else if (at->is_array() && !token.empty() &&
               std::all_of(token.begin(), token.end(),
                           [](char c) { return c >= '0' && c <= '9'; }) &&
               token.size() < 10 && std::stoul(token) < at->size()) {
      at = &(*at)[std::stoul(token)];
    } else {
      return schema_error(path, "$ref \"", text, "\" names nothing in the schema");
    }
    pos = next;
  }
  return at;
}

Result<Sequence> JsonSchemaCompiler::reference(const SchemaJson& ref, const std::string& path) {
  KVVM_ASSIGN_OR_RETURN(const SchemaJson* target, resolve(ref, path));
  (void)target;
  const std::string pointer = ref.get<std::string>().substr(1);
  const auto found = refs_.find(pointer);
  if (found != refs_.end()) return b_.ref(found->second);
  const RuleId rule = grammar_.declare("#" + pointer);
  refs_[pointer] = rule;
  pending_.emplace_back(pointer, rule);
  return b_.ref(rule);
}

Result<Sequence> JsonSchemaCompiler::schema(const SchemaJson& s, const std::string& path,
                                            int depth) {
  KVVM_RETURN_IF_ERROR(depth_bound(path, depth));
  // The grammar's size is checked as it grows, so a bomb stops early: its rule count at every
  // subschema (cheap), its elements (a walk over the rules) every kSizeCheckRules new rules.
  const std::size_t rules = grammar_.rules().size();
  if (rules > options_.limits.max_rules || rules >= checked_rules_ + kSizeCheckRules) {
    checked_rules_ = rules;
    KVVM_RETURN_IF_ERROR(b_.check_size(concat("schema at ", shown_path(path))));
  }
  if (s.is_boolean()) {
    if (s.get<bool>()) return json_.value();
    return schema_error(path, "false matches no value");
  }
  if (!s.is_object()) {
    return schema_error(path, "a schema is an object or a boolean, not ", s.dump());
  }
  for (const auto& [key, value] : s.items()) {
    if (!is_known_keyword(key)) return schema_error(path, "\"", key, "\" is not supported");
  }
  if (s.contains("$ref") || s.contains("allOf")) {
    // A lone $ref is a reference to its target's rule; beside other keywords, it is one more
    // part of allOf.
    SchemaJson rest = s;
    rest.erase("$defs");
    rest.erase("definitions");
    if (s.contains("$ref") && !s.contains("allOf")) {
      rest.erase("$ref");
      if (!has_constraints(rest)) return reference(s["$ref"], child_path(path, "$ref"));
    }
    if (s.contains("allOf") && !s.contains("$ref") && s["allOf"].is_array() &&
        s["allOf"].size() == 1) {
      rest.erase("allOf");
      if (!has_constraints(rest))
        return schema(s["allOf"][0], child_path(path, "allOf/0"), depth + 1);
    }
    KVVM_ASSIGN_OR_RETURN(SchemaJson merged, merge_all_of(s, path, depth));
    return schema(merged, path, depth + 1);
  }
  if (s.contains("anyOf") || s.contains("oneOf")) return combinators(s, path, depth);
  if (s.contains("enum") || s.contains("const")) return enumeration(s, path);
  return typed(s, path, depth);
}

namespace {

// What a oneOf option is known to hold: its types (all when unsaid), its values when it lists
// them (enum / const), and the values its required properties list. Two options are disjoint
// when one of these tells them apart.
struct OptionShape {
  std::set<std::string> types;
  std::optional<std::set<std::string>> values;
  std::map<std::string, std::set<std::string>> required_values;
};

std::optional<std::set<std::string>> listed_values(const SchemaJson& s) {
  if (!s.is_object()) return std::nullopt;
  if (s.contains("const")) return std::set<std::string>{s["const"].dump()};
  if (s.contains("enum") && s["enum"].is_array()) {
    std::set<std::string> out;
    for (const SchemaJson& v : s["enum"]) out.insert(v.dump());
    return out;
  }
  return std::nullopt;
}

bool disjoint(const std::set<std::string>& a, const std::set<std::string>& b) {
  for (const std::string& x : a) {
    if (b.contains(x)) return false;
  }
  return true;
}

}  // namespace

// oneOf is written as anyOf, which is exact only where no value matches two options: the
// options must be told apart by type, by listed values, or by a required property's values.
Status JsonSchemaCompiler::check_one_of(const SchemaJson& options, const std::string& path) {
  std::vector<OptionShape> shapes;
  for (const SchemaJson& option : options) {
    const SchemaJson* s = &option;
    for (int hops = 0; hops < 8 && s->is_object() && s->contains("$ref"); ++hops) {
      KVVM_ASSIGN_OR_RETURN(s, resolve((*s)["$ref"], path));
    }
    OptionShape shape;
    if (s->is_object() && s->contains("type")) {
      const SchemaJson& t = (*s)["type"];
      if (t.is_string()) shape.types.insert(t.get<std::string>());
      if (t.is_array())
        for (const SchemaJson& n : t)
          if (n.is_string()) shape.types.insert(n.get<std::string>());
      if (shape.types.contains("number")) shape.types.insert("integer");
      if (shape.types.contains("integer")) shape.types.insert("number");
    } else {
      for (std::string_view t : kTypes) shape.types.insert(std::string(t));
    }
    shape.values = listed_values(*s);
    if (s->is_object() && s->contains("properties") && (*s)["properties"].is_object() &&
        s->contains("required") && (*s)["required"].is_array()) {
      for (const SchemaJson& name : (*s)["required"]) {
        if (!name.is_string() || !(*s)["properties"].contains(name.get<std::string>())) continue;
        const auto values = listed_values((*s)["properties"][name.get<std::string>()]);
        if (values) shape.required_values[name.get<std::string>()] = *values;
      }
    }
    shapes.push_back(std::move(shape));
  }
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    for (std::size_t j = i + 1; j < shapes.size(); ++j) {
      const OptionShape& a = shapes[i];
      const OptionShape& b = shapes[j];
      bool apart =
          disjoint(a.types, b.types) || (a.values && b.values && disjoint(*a.values, *b.values));
      for (const auto& [name, values] : a.required_values) {
        const auto other = b.required_values.find(name);
        if (other != b.required_values.end() && disjoint(values, other->second)) apart = true;
      }
      if (!apart) {
        return schema_error(path, "\"oneOf\" options ", i, " and ", j,
                            " are not told apart by type, enum/const or a required property's "
                            "enum/const: not supported (anyOf is)");
      }
    }
  }
  return Status::Ok();
}

Result<Sequence> JsonSchemaCompiler::combinators(const SchemaJson& s, const std::string& path,
                                                 int depth) {
  if (s.contains("anyOf") && s.contains("oneOf")) {
    return schema_error(path, "\"anyOf\" beside \"oneOf\" is not supported");
  }
  const std::string key = s.contains("anyOf") ? "anyOf" : "oneOf";
  const SchemaJson& options = s[key];
  if (!options.is_array()) return schema_error(path, "\"", key, "\" is not an array");
  if (key == "oneOf") KVVM_RETURN_IF_ERROR(check_one_of(options, path));
  SchemaJson rest = s;
  rest.erase(key);
  const bool distribute = has_constraints(rest);
  std::vector<Sequence> alternatives;
  for (std::size_t i = 0; i < options.size(); ++i) {
    if (options[i].is_boolean() && !options[i].get<bool>()) continue;  // matches nothing
    const std::string at = child_path(child_path(path, key), std::to_string(i));
    if (!distribute) {
      KVVM_ASSIGN_OR_RETURN(Sequence option, schema(options[i], at, depth + 1));
      alternatives.push_back(std::move(option));
      continue;
    }
    // Keywords beside anyOf hold for every option: each option is merged with them.
    SchemaJson part = rest;
    part["allOf"] = SchemaJson::array({options[i]});
    KVVM_ASSIGN_OR_RETURN(SchemaJson merged, merge_all_of(part, at, depth + 1));
    KVVM_ASSIGN_OR_RETURN(Sequence option, schema(merged, at, depth + 1));
    alternatives.push_back(std::move(option));
  }
  if (alternatives.empty())
    return schema_error(path, "\"", key, "\" has no option a value can match");
  return b_.any_of(concat(shown_path(path), "/", key), std::move(alternatives));
}

Result<Sequence> JsonSchemaCompiler::enumeration(const SchemaJson& s, const std::string& path) {
  for (const auto& [key, value] : s.items()) {
    if (key != "enum" && key != "const" && key != "type" && key != "$defs" &&
        key != "definitions" && !is_annotation(key)) {
      return schema_error(path, "\"", s.contains("enum") ? "enum" : "const", "\" beside \"", key,
                          "\" is not supported");
    }
  }
  std::vector<const SchemaJson*> values;
  if (s.contains("enum")) {
    if (!s["enum"].is_array()) return schema_error(path, "\"enum\" is not an array");
    for (const SchemaJson& v : s["enum"]) {
      if (!s.contains("const") || v == s["const"]) values.push_back(&v);
    }
  } else {
    values.push_back(&s["const"]);
  }
  std::vector<std::string> types;
  if (s.contains("type")) {
    const SchemaJson& t = s["type"];
    if (t.is_string())
      types.push_back(t.get<std::string>());
    else if (t.is_array())
      for (const SchemaJson& name : t)
        if (name.is_string()) types.push_back(name.get<std::string>());
  }
  std::uint64_t bytes = 0;
  std::vector<std::string> texts;
  for (const SchemaJson* v : values) {
    bool fits = types.empty();
    bool integral_only = !types.empty();
    for (const std::string& type : types) {
      if (is_of_type(*v, type)) {
        fits = true;
        if (type != "integer") integral_only = false;
      }
    }
    if (!fits) continue;
    // An integer-typed schema's 2.0 is written 2, as its type's syntax.
    std::string text = integral_only && v->is_number_float()
                           ? std::to_string(static_cast<std::int64_t>(v->get<double>()))
                           : v->dump(-1, ' ', false, SchemaJson::error_handler_t::strict);
    bytes += text.size();
    if (bytes > options_.limits.max_elements) {
      return Status::ResourceExhausted(
          concat("schema at ", shown_path(path), ": \"enum\" passes the grammar's bound of ",
                 options_.limits.max_elements, " elements"),
          {bytes, options_.limits.max_elements, options_.limits.max_elements});
    }
    texts.push_back(std::move(text));
  }
  std::sort(texts.begin(), texts.end());
  texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
  if (texts.empty()) {
    return schema_error(path, s.contains("enum") ? "\"enum\"" : "\"const\"",
                        " leaves no value (empty, or none of the schema's type)");
  }
  std::vector<Sequence> options;
  for (const std::string& text : texts) options.push_back(b_.literal(text));
  return b_.any_of(concat(shown_path(path), "/enum"), std::move(options));
}

Result<Sequence> JsonSchemaCompiler::typed(const SchemaJson& s, const std::string& path,
                                           int depth) {
  std::set<std::string> types;
  if (s.contains("type")) {
    const SchemaJson& t = s["type"];
    std::vector<SchemaJson> names =
        t.is_array() ? std::vector<SchemaJson>(t.begin(), t.end()) : std::vector<SchemaJson>{t};
    for (const SchemaJson& name : names) {
      if (!name.is_string() ||
          std::find(kTypes.begin(), kTypes.end(), name.get<std::string>()) == kTypes.end()) {
        return schema_error(path, "type ", name.dump(), " is not a JSON Schema type");
      }
      types.insert(name.get<std::string>());
    }
    if (types.empty()) return schema_error(path, "\"type\" is an empty list: no value matches");
  } else {
    // No type: the type its keywords are for (a subset of what the schema allows: every value
    // written matches it), or any value when it has none.
    if (has_any(s, kObjectKeywords)) types.insert("object");
    if (has_any(s, kArrayKeywords)) types.insert("array");
    if (has_any(s, kStringKeywords)) types.insert("string");
    if (has_any(s, kNumberKeywords)) types.insert("number");
    if (types.empty()) return json_.value();
  }
  if (types.contains("number")) types.erase("integer");
  std::vector<Sequence> options;
  for (std::string_view type : kTypes) {
    if (!types.contains(std::string(type))) continue;
    Result<Sequence> option = Sequence{};
    if (type == "object")
      option = object(s, path, depth);
    else if (type == "array")
      option = array(s, path, depth);
    else if (type == "string")
      option = string(s, path);
    else if (type == "integer")
      option = integer(s, path);
    else if (type == "number")
      option = number(s, path);
    else if (type == "boolean")
      option = b_.any_of(concat(shown_path(path), "/boolean"),
                         {b_.literal("true"), b_.literal("false")});
    else
      option = b_.literal("null");
    if (!option.ok()) return option.status();
    options.push_back(std::move(*option));
  }
  return b_.any_of(concat(shown_path(path), "/type"), std::move(options));
}

Result<std::optional<std::uint64_t>> count_keyword(const SchemaJson& s, const char* key,
                                                   const std::string& path) {
  if (!s.contains(key)) return std::optional<std::uint64_t>();
  const SchemaJson& v = s[key];
  if (v.is_number_unsigned()) return std::optional<std::uint64_t>(v.get<std::uint64_t>());
  if (v.is_number_float() && v.get<double>() >= 0 && v.get<double>() < 1e18 &&
      std::floor(v.get<double>()) == v.get<double>()) {
    return std::optional<std::uint64_t>(static_cast<std::uint64_t>(v.get<double>()));
  }
  return schema_error(path, "\"", key, "\" ", v.dump(), " is not a non-negative integer");
}

Result<Sequence> JsonSchemaCompiler::object(const SchemaJson& s, const std::string& path,
                                            int depth) {
  static const SchemaJson kTrue = true;
  static const SchemaJson kEmpty = SchemaJson::object();
  const SchemaJson& properties = s.contains("properties") ? s["properties"] : kEmpty;
  if (!properties.is_object()) return schema_error(path, "\"properties\" is not an object");
  std::vector<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) return schema_error(path, "\"required\" is not an array");
    for (const SchemaJson& name : s["required"]) {
      if (!name.is_string()) return schema_error(path, "\"required\" lists ", name.dump());
      if (std::find(required.begin(), required.end(), name.get<std::string>()) == required.end()) {
        required.push_back(name.get<std::string>());
      }
    }
  }
  const SchemaJson& additional =
      s.contains("additionalProperties") ? s["additionalProperties"] : kTrue;
  const bool closed = s.contains("additionalProperties")
                          ? additional.is_boolean() && !additional.get<bool>()
                          : options_.strict;
  const std::string additional_path = child_path(path, "additionalProperties");

  struct Entry {
    std::string name;
    bool required;
    const SchemaJson* schema;
    std::string path;
  };
  std::vector<Entry> entries;
  std::vector<std::string> names;  // every listed name: never an additional property's key
  const auto is_required = [&required](const std::string& name) {
    return std::find(required.begin(), required.end(), name) != required.end();
  };
  for (const auto& [name, sub] : properties.items()) {
    names.push_back(name);
    const std::string at = child_path(child_path(path, "properties"), name);
    if (sub.is_boolean() && !sub.get<bool>()) {
      if (is_required(name)) {
        return schema_error(at, "the required property \"", name, "\" has the schema false");
      }
      continue;  // may never appear
    }
    entries.push_back({name, is_required(name), &sub, at});
  }
  for (const std::string& name : required) {
    if (properties.contains(name)) continue;
    if (closed) {
      return schema_error(path, "the required property \"", name,
                          "\" is not in \"properties\" and additional properties are not allowed");
    }
    names.push_back(name);
    entries.push_back({name, true, additional.is_object() ? &additional : &kTrue, additional_path});
  }
  std::size_t required_count = 0;
  for (const Entry& e : entries) required_count += e.required;
  KVVM_ASSIGN_OR_RETURN(std::optional<std::uint64_t> min_properties,
                        count_keyword(s, "minProperties", path));
  KVVM_ASSIGN_OR_RETURN(std::optional<std::uint64_t> max_properties,
                        count_keyword(s, "maxProperties", path));
  // Enforced only where the listed properties already keep them.
  if (min_properties && *min_properties > required_count) {
    return schema_error(path, "\"minProperties\" ", *min_properties,
                        " past the required properties' count is not supported");
  }
  if (max_properties && (!closed || *max_properties < entries.size())) {
    return schema_error(path, "\"maxProperties\" ", *max_properties,
                        " below the properties an object may have is not supported");
  }

  const Sequence ws = json_.ws();
  const Sequence colon = Builder::cat({ws, b_.literal(":"), ws});
  std::optional<Sequence> extra;
  if (!closed) {
    KVVM_ASSIGN_OR_RETURN(Sequence key, key_other_than(names, additional_path));
    KVVM_ASSIGN_OR_RETURN(Sequence value, schema(additional, additional_path, depth + 1));
    extra = b_.any_of(additional_path, {Builder::cat({key, colon, value, ws})});
  }
  // From the last property back: after_some[i] follows i listed places with at least one
  // property written (so the next needs a comma), after_none[i] with none written.
  Sequence after_some, after_none;
  if (extra) {
    after_some = b_.star(concat(additional_path, "-more"), Builder::cat({json_.comma(), *extra}));
    after_none = json_.list(concat(additional_path, "-list"), *extra);
  }
  for (std::size_t i = entries.size(); i-- > 0;) {
    const Entry& e = entries[i];
    KVVM_ASSIGN_OR_RETURN(Sequence value, schema(*e.schema, e.path, depth + 1));
    const SchemaJson key = e.name;
    // A rule of its own: both states below refer to it.
    const RuleId pair_rule = grammar_.add(
        concat(e.path, "-pair"), {Builder::cat({b_.literal(key.dump()), colon, value, ws})});
    std::vector<Sequence> some = {Builder::cat({json_.comma(), b_.ref(pair_rule), after_some})};
    std::vector<Sequence> none = {Builder::cat({b_.ref(pair_rule), after_some})};
    if (!e.required) {
      some.push_back(after_some);
      none.push_back(after_none);
    }
    after_some = b_.ref(grammar_.add(concat(e.path, "-after-some"), std::move(some)));
    after_none = b_.ref(grammar_.add(concat(e.path, "-after-none"), std::move(none)));
  }
  return Builder::cat({b_.literal("{"), ws, after_none, b_.literal("}")});
}

Result<Sequence> JsonSchemaCompiler::key_other_than(const std::vector<std::string>& names,
                                                    const std::string& path) {
  // Keys are written without escapes, so a key's text is its value and the listed names can
  // be left out exactly: a trie of the names (by code point) whose every node also allows
  // ending elsewhere than a name or going off the trie.
  struct Node {
    std::map<std::uint32_t, std::size_t> children;
    bool terminal = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& name : names) {
    std::vector<std::uint32_t> cps;
    bool plain = true;
    for (std::size_t i = 0; i < name.size();) {
      const auto c = static_cast<std::uint8_t>(name[i]);
      const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
      for (int k = 1; k < n && i + k < name.size(); ++k) cp = (cp << 6) | (name[i + k] & 0x3F);
      if (cp < 0x20 || cp == '"' || cp == '\\') plain = false;
      cps.push_back(cp);
      i += n;
    }
    if (!plain) continue;  // a key written without escapes never equals it
    std::size_t at = 0;
    for (std::uint32_t cp : cps) {
      auto found = trie[at].children.find(cp);
      if (found == trie[at].children.end()) {
        trie.push_back({});
        found = trie[at].children.emplace(cp, trie.size() - 1).first;
      }
      at = found->second;
    }
    trie[at].terminal = true;
  }
  const Sequence quote = b_.literal("\"");
  const Sequence rest =
      Builder::cat({b_.star(concat(path, "-key-rest"), json_.plain_char()), quote});
  std::vector<RuleId> rules(trie.size());
  for (std::size_t i = 0; i < trie.size(); ++i) rules[i] = grammar_.declare(concat(path, "-key"));
  for (std::size_t i = 0; i < trie.size(); ++i) {
    std::vector<Sequence> options;
    if (!trie[i].terminal) options.push_back(quote);
    std::vector<CodepointRange> taken = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    for (const auto& [cp, child] : trie[i].children) {
      std::string utf8;
      tokenizer::detail::utf8_append(utf8, static_cast<char32_t>(cp));
      options.push_back(Builder::cat({b_.literal(utf8), b_.ref(rules[child])}));
      taken.push_back({cp, cp});
    }
    options.push_back(Builder::cat({b_.codepoints(concat(path, "-key-other"), taken, true), rest}));
    grammar_.define(rules[i], std::move(options));
  }
  return Builder::cat({quote, b_.ref(rules[0])});
}

Result<Sequence> JsonSchemaCompiler::array(const SchemaJson& s, const std::string& path,
                                           int depth) {
  static const SchemaJson kTrue = true;
  std::vector<std::pair<const SchemaJson*, std::string>> prefix;
  const SchemaJson* rest = &kTrue;
  std::string rest_path = child_path(path, "items");
  const auto take_prefix = [&](const char* key) -> Status {
    const SchemaJson& list = s[key];
    for (std::size_t i = 0; i < list.size(); ++i) {
      prefix.emplace_back(&list[i], child_path(child_path(path, key), std::to_string(i)));
    }
    return Status::Ok();
  };
  if (s.contains("prefixItems")) {
    if (!s["prefixItems"].is_array()) return schema_error(path, "\"prefixItems\" is not an array");
    KVVM_RETURN_IF_ERROR(take_prefix("prefixItems"));
    if (s.contains("items")) {
      if (s["items"].is_array())
        return schema_error(path, "\"items\" is an array beside \"prefixItems\"");
      rest = &s["items"];
    }
  } else if (s.contains("items") && s["items"].is_array()) {
    // The older form: items as a list, additionalItems for the rest.
    KVVM_RETURN_IF_ERROR(take_prefix("items"));
    if (s.contains("additionalItems")) {
      rest = &s["additionalItems"];
      rest_path = child_path(path, "additionalItems");
    }
  } else if (s.contains("items")) {
    rest = &s["items"];
  }
  if (s.contains("uniqueItems") &&
      !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>())) {
    return schema_error(path, "\"uniqueItems\" ", s["uniqueItems"].dump(), " is not supported");
  }
  KVVM_ASSIGN_OR_RETURN(std::optional<std::uint64_t> min_items, count_keyword(s, "minItems", path));
  KVVM_ASSIGN_OR_RETURN(std::optional<std::uint64_t> max_items, count_keyword(s, "maxItems", path));
  const std::uint64_t min = min_items.value_or(0);
  std::optional<std::uint64_t> max = max_items;
  // An item whose schema is false ends the array before it.
  const auto is_false = [](const SchemaJson& v) { return v.is_boolean() && !v.get<bool>(); };
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (is_false(*prefix[i].first)) {
      prefix.resize(i);
      max = std::min<std::uint64_t>(max.value_or(i), i);
      rest = nullptr;
      break;
    }
  }
  if (rest && is_false(*rest)) {
    rest = nullptr;
    max = std::min<std::uint64_t>(max.value_or(prefix.size()), prefix.size());
  }
  if (max && min > *max) {
    return schema_error(path, "\"minItems\" ", min, " is more than the ", *max,
                        " items the array may hold");
  }
  if (max && prefix.size() > *max) prefix.resize(*max);
  const Sequence ws = json_.ws();
  const std::size_t k = prefix.size();
  Sequence tail;
  if (rest && (!max || *max > k)) {
    KVVM_ASSIGN_OR_RETURN(Sequence item, schema(*rest, rest_path, depth + 1));
    const Sequence body = Builder::cat({item, ws});
    const std::optional<std::uint64_t> more =
        max ? std::optional<std::uint64_t>(*max - k) : std::nullopt;
    // Named as the schema's place: a repetition past the bounds says where it is.
    const std::string name = concat("schema at ", shown_path(rest_path));
    Result<Sequence> list =
        k == 0 ? b_.separated(name, body, json_.comma(), min, more)
               : b_.repeat(name, Builder::cat({json_.comma(), body}), min > k ? min - k : 0, more);
    if (!list.ok()) return list.status();
    tail = std::move(*list);
  }
  for (std::size_t i = k; i-- > 0;) {
    KVVM_ASSIGN_OR_RETURN(Sequence item, schema(*prefix[i].first, prefix[i].second, depth + 1));
    std::vector<Sequence> options;
    if (i >= min) options.push_back({});
    options.push_back(Builder::cat({i > 0 ? json_.comma() : Sequence{}, item, ws, tail}));
    tail = b_.ref(grammar_.add(concat(prefix[i].second, "-on"), std::move(options)));
  }
  return Builder::cat({b_.literal("["), ws, tail, b_.literal("]")});
}

Result<Grammar> grammar_from_json_schema(std::string_view schema_json,
                                         const JsonSchemaOptions& options) {
  if (nests_too_deep(schema_json)) {
    return Status::ResourceExhausted(
        concat("schema: the JSON text nests past the bound of ", kMaxTextDepth, " levels"),
        {0, kMaxTextDepth, kMaxTextDepth});
  }
  const SchemaJson schema = SchemaJson::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return Status::InvalidArgument("schema: not valid JSON");
  Grammar grammar;
  JsonSchemaCompiler compiler(schema, grammar, options);
  KVVM_RETURN_IF_ERROR(compiler.compile());
  return grammar;
}

}  // namespace kvvm::grammar
