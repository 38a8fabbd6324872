// Structured output as the API asks for it, settled into at most one grammar::Constraint per
// request, then compiled through the server's GrammarCache on the HTTP handler's thread (never
// on the engine's step):
// - OpenAI's response_format: {"type": "text"} (no constraint), {"type": "json_object"} (any
//   JSON object), {"type": "json_schema", "json_schema": {"name": ^[a-zA-Z0-9_-]{1,64}$,
//   "schema": {...}, "strict": bool, "description"}} (strict: OpenAI's strict mode);
// - vLLM's guided_json (a schema object or its text), guided_regex, guided_choice (strings),
//   guided_grammar (GBNF);
// - vLLM's newer structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object":
//   true}, with disable_any_whitespace (false: flexible JSON whitespace) and
//   disable_additional_properties (true: strict).
// JSON whitespace is compact unless structured_outputs asks otherwise. A schema keeps the
// order the client wrote its properties in (the output's keys follow it).
//
// Nothing near a constraint is ignored: two constraints are a 400 naming both fields; a
// guided_* field or a structured_outputs key kvvm does not know, a response_format key other
// than type and json_schema (and json_schema's own), are refused by name. A compile error is a
// 400 with the compiler's message after the field ("response_format.json_schema.schema:
// schema at /properties/a: \"if\" is not supported"), a schema past the grammar's bounds too.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "field_values.h"
#include "kvvm/grammar/compiled_grammar.h"
#include "kvvm/grammar/constraint.h"
#include "kvvm/grammar/grammar_cache.h"
#include "openai_request.h"
#include "request_fields.h"

namespace kvvm::server {

// The request's constraint, nullopt when it asks for none. `raw_body`: the body's text, read
// again for a schema's property order (the reader's JSON sorts keys). `ignored`: the keys the
// table did not know, where an unknown guided_* field is found.
Check settle_structured_output(const RequestBody& body, std::string_view raw_body,
                               const std::vector<std::string>& ignored,
                               std::optional<ConstraintRequest>* out);

// The compiled grammar of `request`, from the cache or compiled now on the calling thread; the
// constraint's refusal as a 400 naming its field.
std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> compile_constraint(
    grammar::GrammarCache& cache, const ConstraintRequest& request);

}  // namespace kvvm::server
