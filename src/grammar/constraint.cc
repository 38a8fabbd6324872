#include "kvvm/grammar/constraint.h"

#include <algorithm>
#include <chrono>

namespace kvvm::grammar {

std::string_view to_string(Constraint::Kind kind) {
  switch (kind) {
    case Constraint::Kind::kJsonSchema:
      return "json_schema";
    case Constraint::Kind::kJsonObject:
      return "json_object";
    case Constraint::Kind::kRegex:
      return "regex";
    case Constraint::Kind::kGbnf:
      return "grammar";
    case Constraint::Kind::kChoices:
      return "choice";
    case Constraint::Kind::kToolCalls:
      return "tool_calls";
  }
  return "unknown";
}

Result<Grammar> grammar_of(const Constraint& constraint, const GrammarLimits& limits) {
  switch (constraint.kind) {
    case Constraint::Kind::kJsonSchema:
      return grammar_from_json_schema(
          constraint.text,
          JsonSchemaOptions{
              .whitespace = constraint.whitespace, .strict = constraint.strict, .limits = limits});
    case Constraint::Kind::kJsonObject:
      return json_object_grammar(constraint.whitespace);
    case Constraint::Kind::kRegex:
      return grammar_from_regex(constraint.text, limits);
    case Constraint::Kind::kGbnf:
      return grammar_from_gbnf(constraint.text, limits);
    case Constraint::Kind::kChoices:
      return grammar_from_choices(constraint.choices, limits);
    case Constraint::Kind::kToolCalls:
      return grammar_from_tool_calls(
          constraint.tool_calls,
          JsonSchemaOptions{.whitespace = {}, .strict = constraint.strict, .limits = limits});
  }
  return Status::InvalidArgument("unknown constraint kind");
}

}  // namespace kvvm::grammar
