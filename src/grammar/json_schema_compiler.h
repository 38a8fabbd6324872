// The JSON Schema compiler behind grammar_from_json_schema (kvvm/grammar/constraint.h): a schema
// is walked once, top down, each subschema becoming a Sequence of the grammar; a $ref target
// becomes a rule of its own, declared at its first reference and compiled after the root, so
// recursive schemas are recursive rules. The walk is split by concept: objects, arrays and the
// combinators here (json_schema_source.cc), strings (json_schema_strings.cc), numbers
// (json_schema_numbers.cc), allOf's merge (json_schema_merge.cc).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/builder.h"
#include "grammar/json_values.h"
#include "grammar/text.h"
#include "kvvm/grammar/constraint.h"

namespace kvvm::grammar {

// Object keys keep the schema's order: properties are written in it.
using SchemaJson = nlohmann::ordered_json;

// Subschemas nested deeper than this are refused (a schema bomb, or a stack overflow).
inline constexpr int kMaxSchemaDepth = 64;
// New rules between two checks of the grammar's element count.
inline constexpr std::size_t kSizeCheckRules = 1024;

// "/" for the root, the JSON pointer otherwise.
std::string shown_path(std::string_view path);
// `path` + "/" + `key`, the key escaped as JSON pointers escape it (~0, ~1).
std::string child_path(std::string_view path, std::string_view key);

template <typename... Parts>
Status schema_error(std::string_view path, const Parts&... parts) {
  return Status::InvalidArgument(concat("schema at ", shown_path(path), ": ", parts...));
}

// A non-negative integer keyword (minLength, minItems, ...), nullopt when absent.
Result<std::optional<std::uint64_t>> count_keyword(const SchemaJson& s, const char* key,
                                                   const std::string& path);

// What each keyword is: read and ignored, enforced (for which type), or unknown.
bool is_annotation(std::string_view keyword);
bool is_known_keyword(std::string_view keyword);
// Whether `schema` (an object) has a keyword other than annotations and $defs.
bool has_constraints(const SchemaJson& schema);

class JsonSchemaCompiler {
 public:
  JsonSchemaCompiler(const SchemaJson& root, Grammar& grammar, const JsonSchemaOptions& options);
  // Compiles the root and every $ref target; sets the grammar's root.
  Status compile();

 private:
  Result<Sequence> schema(const SchemaJson& s, const std::string& path, int depth);
  Result<Sequence> combinators(const SchemaJson& s, const std::string& path, int depth);
  Status check_one_of(const SchemaJson& options, const std::string& path);
  Result<Sequence> enumeration(const SchemaJson& s, const std::string& path);
  Result<Sequence> typed(const SchemaJson& s, const std::string& path, int depth);
  Result<Sequence> object(const SchemaJson& s, const std::string& path, int depth);
  Result<Sequence> key_other_than(const std::vector<std::string>& names, const std::string& path);
  Result<Sequence> array(const SchemaJson& s, const std::string& path, int depth);
  Result<Sequence> reference(const SchemaJson& ref, const std::string& path);

  // json_schema_strings.cc
  Result<Sequence> string(const SchemaJson& s, const std::string& path);
  Result<Sequence> format(std::string_view name, const std::string& path);
  Result<Sequence> pattern(std::string_view pattern, const std::string& path);

  // json_schema_numbers.cc
  Result<Sequence> integer(const SchemaJson& s, const std::string& path);
  Result<Sequence> number(const SchemaJson& s, const std::string& path);

  // json_schema_merge.cc: allOf's parts (and a $ref's siblings) merged into one schema.
  Result<SchemaJson> merge_all_of(const SchemaJson& s, const std::string& path, int depth);

  // The subschema a local $ref names, or InvalidArgument.
  Result<const SchemaJson*> resolve(const SchemaJson& ref, const std::string& path) const;
  Status depth_bound(const std::string& path, int depth) const;

  const SchemaJson& root_;
  Grammar& grammar_;
  JsonSchemaOptions options_;
  Builder b_;
  JsonValues json_;
  std::map<std::string, RuleId> refs_;  // by JSON pointer
  std::vector<std::pair<std::string, RuleId>> pending_;
  std::map<std::string, RuleId> formats_;
  std::size_t checked_rules_ = 0;
};

}  // namespace kvvm::grammar
