// Constraint: what a request may ask its output to match, as the API and the CLI take it (a JSON
// Schema, any JSON object, a regular expression, GBNF text, a list of choices), and the front
// ends that compile each kind to a Grammar (kvvm/grammar/grammar.h).
//
// Every refusal is InvalidArgument naming the place (a schema's JSON pointer and keyword, a
// pattern's byte offset, a grammar's line and column) and what is wrong there, or
// ResourceExhausted naming the bound a schema bomb ran into. Nothing is ever ignored: a schema
// keyword the compiler cannot enforce is refused by name.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/grammar/grammar.h"

namespace kvvm::grammar {

// Whitespace the JSON grammars allow between tokens.
struct JsonWhitespace {
  // false (the default, as OpenAI's strict outputs): none at all, `{"a":1,"b":[2,3]}`.
  // true: spaces, tabs and newlines where JSON allows them, at most `max_run` in a row, so a
  // model cannot spend its budget on blanks.
  bool flexible = false;
  std::uint32_t max_run = 16;
};

struct JsonSchemaOptions {
  JsonWhitespace whitespace;
  // OpenAI's strict mode: properties not listed are not allowed even where the schema leaves
  // additionalProperties out (strict schemas must say false anyway); false: JSON Schema's
  // default, where any other property is allowed.
  bool strict = false;
  GrammarLimits limits;
};

// The JSON Schema in `schema_json` (a JSON text). The keywords enforced: type (a name or a
// list), properties (written in the schema's order), required, additionalProperties (false,
// true or a schema), items, prefixItems, enum, const, anyOf, oneOf (where its options cannot
// overlap: different types, different enum / const values, or a required property whose values
// differ, as pydantic's tagged unions; otherwise refused, since the grammar could not keep
// "exactly one"), allOf (merged where its parts merge), $ref to "#" or any pointer inside the
// schema ("#/$defs/...", "#/definitions/...", recursive too), minLength / maxLength (code
// points) / pattern, format (date, time, date-time, uuid, email), minimum / maximum /
// exclusiveMinimum / exclusiveMaximum (exact on integers, and on numbers for integer-valued
// bounds), minItems / maxItems. Annotations (title, description, default, examples, $schema,
// $id, $comment, deprecated, readOnly, writeOnly) are read and ignored. Anything else is
// refused: "schema at /properties/a: \"if\" is not supported".
Result<Grammar> grammar_from_json_schema(std::string_view schema_json,
                                         const JsonSchemaOptions& options = {});
// Any JSON object (response_format json_object).
Grammar json_object_grammar(const JsonWhitespace& whitespace = {});

// A regular expression in the ECMAScript syntax JSON Schema patterns use, matched whole (as
// if anchored at both ends; ^ and $ at the ends are accepted): literals and escapes, ., [...]
// classes and negations, \d \w \s \D \W \S, \uXXXX and \u{...}, groups (capturing,
// (?:...), named), |, ?, *, +, {m}, {m,}, {m,n} and their lazy forms (the same language).
// Lookaround, backreferences, \b \B and anchors inside the pattern are refused by name.
Result<Grammar> grammar_from_regex(std::string_view pattern, const GrammarLimits& limits = {});

// GBNF as llama.cpp users write it: `name ::= ...` rules (root is the start), "literals" with
// escapes, [classes] and [^negations] over code points, (groups), |, ?, *, +, {m}, {m,},
// {m,n}, `.`, # comments, rules across lines.
Result<Grammar> grammar_from_gbnf(std::string_view text, const GrammarLimits& limits = {});

// Exactly one of `choices` (byte for byte). InvalidArgument for none, or an empty one.
Result<Grammar> grammar_from_choices(std::span<const std::string> choices,
                                     const GrammarLimits& limits = {});

// A tool a request offers, as the grammar of its calls needs it.
struct ToolSchema {
  std::string name;
  std::string parameters_json;  // a JSON Schema (an object's); "{}" or empty: any JSON object
};

// The calls a model may write in its family's spelling: the language is
//   open CALL (between CALL){min_calls - 1, max_calls - 1} close
// where CALL is {"name": "<one of the tools' names>", "<arguments_key>": <that tool's
// parameters>} with "name" first. One open and one close around all calls, so that an array
// family (Mistral's [TOOL_CALLS][c1, c2]) and a tagged one (hermes, whose `between` closes one
// block and opens the next) are both written by it.
struct ToolCallsSpec {
  std::vector<ToolSchema> tools;
  std::string open;
  std::string close;
  std::string between;
  std::string arguments_key = "arguments";
  std::uint32_t min_calls = 1;
  std::uint32_t max_calls = 1;  // 0: any number (parallel_tool_calls)
  // true: the grammar starts right after `open` (tool_choice auto, where the constraint begins
  // once the model wrote the opening text itself).
  bool after_open = false;
  // Flexible by default: models write {"name": "f", "arguments": {...}} with spaces.
  JsonWhitespace whitespace{.flexible = true};
};

// The calls of `spec`. Each tool's parameters compile with the JSON Schema front end under
// `options.strict` and `options.limits`; the spec's whitespace governs the whole call
// (options.whitespace is not read). A schema that front end refuses is refused naming the tool:
// "tools[2] (get_weather).function.parameters: schema at /properties/a: ...". InvalidArgument
// as well for no tools, an empty or repeated name, max_calls below min_calls, min_calls 0.
Result<Grammar> grammar_from_tool_calls(const ToolCallsSpec& spec,
                                        const JsonSchemaOptions& options = {});

struct Constraint {
  enum class Kind : std::uint8_t { kJsonSchema, kJsonObject, kRegex, kGbnf, kChoices, kToolCalls };
  Kind kind = Kind::kJsonObject;
  std::string text;                  // the schema (JSON text), the pattern or the GBNF text
  std::vector<std::string> choices;  // kChoices
  JsonWhitespace whitespace;         // kJsonSchema, kJsonObject
  bool strict = false;               // kJsonSchema, kToolCalls (JsonSchemaOptions::strict)
  ToolCallsSpec tool_calls;          // kToolCalls
};
std::string_view to_string(Constraint::Kind kind);

// The constraint's grammar (sources.h's front ends); their errors as they give them.
Result<Grammar> grammar_of(const Constraint& constraint, const GrammarLimits& limits = {});

}  // namespace kvvm::grammar
