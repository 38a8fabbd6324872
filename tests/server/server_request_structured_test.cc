// Structured output as the request bodies ask for it: OpenAI's response_format, vLLM's guided_*
// fields and structured_outputs, each read into the one constraint it means (on both
// generation endpoints), and every malformed, unknown or second constraint refused naming its
// field. Compiling is the server's (server_structured_output_test.cc).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server_request_fixture.h"

namespace kvvm::server::request_test {
namespace {

using grammar::Constraint;

const std::string kCompletion = R"({"model": "m", "prompt": "hi", )";
const std::string kChat = R"({"model": "m", "messages": [{"role": "user", "content": "a"}], )";

// The head of a body for `endpoint`; the test appends its fields and the closing brace.
std::string head(Endpoint endpoint) { return endpoint == Endpoint::kChat ? kChat : kCompletion; }

TEST_F(ServerRequest, EachStructuredOutputFieldIsItsConstraint) {
  struct Case {
    std::string fields;
    Constraint::Kind kind;
    std::string field;  // where its compile errors point
    std::string text;   // the constraint's text, when it has one
  };
  const std::vector<Case> cases = {
      {R"("response_format": {"type": "json_object"})", Constraint::Kind::kJsonObject,
       "response_format", ""},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "a-B_9",
          "schema": {"type": "object"}}})",
       Constraint::Kind::kJsonSchema, "response_format.json_schema.schema", R"({"type":"object"})"},
      {R"("guided_json": {"type": "integer"})", Constraint::Kind::kJsonSchema, "guided_json",
       R"({"type":"integer"})"},
      // Text is passed as written: the compiler reads it and names what is wrong.
      {R"("guided_json": "{\"type\": \"integer\"}")", Constraint::Kind::kJsonSchema, "guided_json",
       R"({"type": "integer"})"},
      {R"("guided_regex": "[0-9]{3}")", Constraint::Kind::kRegex, "guided_regex", "[0-9]{3}"},
      {R"("guided_choice": ["yes", "no"])", Constraint::Kind::kChoices, "guided_choice", ""},
      {R"("guided_grammar": "root ::= \"a\"")", Constraint::Kind::kGbnf, "guided_grammar",
       R"(root ::= "a")"},
      {R"("structured_outputs": {"json": {"type": "string"}})", Constraint::Kind::kJsonSchema,
       "structured_outputs.json", R"({"type":"string"})"},
      {R"("structured_outputs": {"regex": "a+"})", Constraint::Kind::kRegex,
       "structured_outputs.regex", "a+"},
      {R"("structured_outputs": {"choice": ["x"]})", Constraint::Kind::kChoices,
       "structured_outputs.choice", ""},
      {R"("structured_outputs": {"grammar": "root ::= \"b\""})", Constraint::Kind::kGbnf,
       "structured_outputs.grammar", R"(root ::= "b")"},
      {R"("structured_outputs": {"json_object": true})", Constraint::Kind::kJsonObject,
       "structured_outputs.json_object", ""},
  };
  for (const Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChat}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.fields);
      const ApiRequest request = accept(endpoint, head(endpoint) + c.fields + "}", adder());
      ASSERT_TRUE(request.constraint.has_value());
      EXPECT_EQ(request.constraint->constraint.kind, c.kind);
      EXPECT_EQ(request.constraint->field, c.field);
      EXPECT_EQ(request.constraint->constraint.text, c.text);
      // Compact JSON by default, as OpenAI's strict outputs; not strict unless asked.
      EXPECT_FALSE(request.constraint->constraint.whitespace.flexible);
      EXPECT_FALSE(request.constraint->constraint.strict);
      EXPECT_TRUE(request.ignored.empty()) << request.ignored.front();
    }
  }
  const ApiRequest choices =
      accept(Endpoint::kChat, kChat + R"("guided_choice": ["yes", "no"]})", adder());
  ASSERT_TRUE(choices.constraint.has_value());
  EXPECT_EQ(choices.constraint->constraint.choices, (std::vector<std::string>{"yes", "no"}));
}

TEST_F(ServerRequest, NoConstraintWhereNoneIsAsked) {
  for (const char* fields :
       {R"("response_format": {"type": "text"})", R"("response_format": null)",
        R"("response_format": {"type": "text", "json_schema": null})",
        R"("guided_json": null, "guided_regex": null, "guided_choice": null)",
        R"("guided_whitespace_pattern": null)", R"("guided_decoding_backend": "xgrammar")",
        R"("guided_decoding_backend": "outlines")", R"("guided_decoding_backend": "auto")",
        R"("structured_outputs": {})", R"("structured_outputs": {"json_object": false})",
        R"("structured_outputs": {"disable_fallback": true})"}) {
    SCOPED_TRACE(fields);
    for (const Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChat}) {
      const ApiRequest request = accept(endpoint, head(endpoint) + fields + "}", adder());
      EXPECT_FALSE(request.constraint.has_value());
      EXPECT_TRUE(request.ignored.empty());
    }
  }
}

TEST_F(ServerRequest, SchemaStrictnessWhitespaceAndPropertyOrder) {
  // OpenAI's strict mode.
  ApiRequest request = accept(Endpoint::kChat, kChat + R"("response_format": {"type":
      "json_schema", "json_schema": {"name": "answer", "description": "what it is", "strict":
      true, "schema": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha":
      {"type": "integer"}}, "required": ["zeta", "alpha"], "additionalProperties": false}}}})",
                              adder());
  ASSERT_TRUE(request.constraint.has_value());
  EXPECT_TRUE(request.constraint->constraint.strict);
  // The client's property order, not the reader's sorted one: the output's keys follow it.
  EXPECT_EQ(request.constraint->constraint.text,
            R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":)"
            R"({"type":"integer"}},"required":["zeta","alpha"],"additionalProperties":false})");
  request = accept(Endpoint::kCompletions,
                   kCompletion + R"("guided_json": {"properties": {"b": {}, "a": {}}}})", adder());
  ASSERT_TRUE(request.constraint.has_value());
  EXPECT_EQ(request.constraint->constraint.text, R"({"properties":{"b":{},"a":{}}})");

  // vLLM's options of structured_outputs: any whitespace (flexible) and no additional
  // properties (strict).
  request = accept(Endpoint::kCompletions, kCompletion + R"("structured_outputs": {"json":
      {"type": "object"}, "disable_any_whitespace": false, "disable_additional_properties":
      true}})",
                   adder());
  ASSERT_TRUE(request.constraint.has_value());
  EXPECT_TRUE(request.constraint->constraint.whitespace.flexible);
  EXPECT_TRUE(request.constraint->constraint.strict);
  request = accept(Endpoint::kCompletions, kCompletion + R"("structured_outputs": {
      "json_object": true, "disable_any_whitespace": true}})",
                   adder());
  ASSERT_TRUE(request.constraint.has_value());
  EXPECT_FALSE(request.constraint->constraint.whitespace.flexible);
  // strict false stays false.
  request = accept(Endpoint::kCompletions, kCompletion + R"("response_format": {"type":
      "json_schema", "json_schema": {"name": "x", "strict": false, "schema": {}}}})",
                   adder());
  ASSERT_TRUE(request.constraint.has_value());
  EXPECT_FALSE(request.constraint->constraint.strict);
}

TEST_F(ServerRequest, MalformedStructuredOutputIsRefusedNamingTheField) {
  const std::string name65(65, 'a');
  const std::vector<Refusal> refusals = {
      {Endpoint::kChat, R"("response_format": "json")", "response_format", "object"},
      {Endpoint::kChat, R"("response_format": {})", "response_format.type", "is required"},
      {Endpoint::kChat, R"("response_format": {"type": 5})", "response_format.type", "string"},
      {Endpoint::kChat, R"("response_format": {"type": "xml"})", "response_format.type",
       R"("xml" is not a response format: text, json_object or json_schema)"},
      {Endpoint::kChat, R"("response_format": {"type": "json_object", "schema": {}})",
       "response_format.schema", "type, json_schema"},
      {Endpoint::kChat, R"("response_format": {"type": "text", "json_schema": {"name": "a"}})",
       "response_format.json_schema", R"(only with type "json_schema")"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema"})",
       "response_format.json_schema", "is required"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema", "json_schema": []})",
       "response_format.json_schema", "array"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema", "json_schema": {"schema":
          {}}})",
       "response_format.json_schema.name", "is required"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema", "json_schema": {"name":
          "my schema", "schema": {}}})",
       "response_format.json_schema.name", R"("my schema" must be 1 to 64 of)"},
      {Endpoint::kCompletions, R"("response_format": {"type": "json_schema", "json_schema":
          {"name": ")" + name65 + R"(", "schema": {}}})",
       "response_format.json_schema.name", "1 to 64"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema", "json_schema": {"name":
          "", "schema": {}}})",
       "response_format.json_schema.name", "1 to 64"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema", "json_schema": {"name":
          7, "schema": {}}})",
       "response_format.json_schema.name", "string"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema", "json_schema": {"name":
          "a"}})",
       "response_format.json_schema.schema", "is required"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema", "json_schema": {"name":
          "a", "schema": "{}"}})",
       "response_format.json_schema.schema", "must be an object, not string"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema", "json_schema": {"name":
          "a", "schema": {}, "strict": "yes"}})",
       "response_format.json_schema.strict", "true or false"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema", "json_schema": {"name":
          "a", "schema": {}, "description": 1}})",
       "response_format.json_schema.description", "string"},
      {Endpoint::kChat, R"("response_format": {"type": "json_schema", "json_schema": {"name":
          "a", "schema": {}, "schema_version": 2}})",
       "response_format.json_schema.schema_version", "name, description, schema, strict"},
      {Endpoint::kCompletions, R"("guided_json": 5)", "guided_json", "number"},
      {Endpoint::kCompletions, R"("guided_json": "")", "guided_json", "is empty"},
      {Endpoint::kCompletions, R"("guided_regex": 5)", "guided_regex", "string"},
      {Endpoint::kCompletions, R"("guided_choice": "yes")", "guided_choice", "array"},
      {Endpoint::kCompletions, R"("guided_choice": [])", "guided_choice", "is empty"},
      {Endpoint::kCompletions, R"("guided_choice": ["a", 1])", "guided_choice[1]", "string"},
      {Endpoint::kCompletions, R"("guided_choice": ["a", ""])", "guided_choice[1]", "is empty"},
      {Endpoint::kCompletions, R"("guided_grammar": {"root": "a"})", "guided_grammar", "string"},
      {Endpoint::kCompletions, R"("guided_decoding_backend": 1)", "guided_decoding_backend",
       "string"},
      {Endpoint::kChat, R"("structured_outputs": "regex")", "structured_outputs", "object"},
      {Endpoint::kChat, R"("structured_outputs": {"regex": 1})", "structured_outputs.regex",
       "string"},
      {Endpoint::kChat, R"("structured_outputs": {"json": 1})", "structured_outputs.json",
       "JSON Schema"},
      {Endpoint::kChat, R"("structured_outputs": {"choice": []})", "structured_outputs.choice",
       "is empty"},
      {Endpoint::kChat, R"("structured_outputs": {"json_object": "yes"})",
       "structured_outputs.json_object", "true or false"},
      {Endpoint::kChat, R"("structured_outputs": {"disable_any_whitespace": 0})",
       "structured_outputs.disable_any_whitespace", "true or false"},
      {Endpoint::kChat, R"("structured_outputs": {"xml": "<a/>"})", "structured_outputs.xml",
       "json, regex, choice, grammar, json_object"},
  };
  for (const Refusal& refusal : refusals) {
    SCOPED_TRACE(refusal.body);
    const ApiError error =
        refuse(refusal.endpoint, head(refusal.endpoint) + refusal.body + "}", adder());
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, refusal.param);
    EXPECT_TRUE(error.message.starts_with(refusal.param + ": ")) << error.message;
    EXPECT_TRUE(contains(error.message, refusal.mention)) << error.message;
  }
}

// What kvvm's grammar engine cannot honour is refused by name, never ignored: the client would
// get unconstrained output believing it constrained.
TEST_F(ServerRequest, UnknownOrUnsupportedConstraintsAreRefusedNotIgnored) {
  const std::vector<Refusal> refusals = {
      {Endpoint::kCompletions, R"("guided_whitespace_pattern": "[ ]*")",
       "guided_whitespace_pattern", "is not supported by this server"},
      {Endpoint::kChat, R"("guided_foo": "bar")", "guided_foo",
       "is not a guided decoding field kvvm knows"},
      {Endpoint::kCompletions, R"("guided_json_object": true)", "guided_json_object",
       "is not a guided decoding field kvvm knows"},
      {Endpoint::kChat, R"("structured_outputs": {"whitespace_pattern": " ?"})",
       "structured_outputs.whitespace_pattern", "is not supported by this server"},
      {Endpoint::kChat, R"("structured_outputs": {"structural_tag": "{}"})",
       "structured_outputs.structural_tag", "is not supported by this server"},
  };
  for (const Refusal& refusal : refusals) {
    SCOPED_TRACE(refusal.body);
    const ApiError error =
        refuse(refusal.endpoint, head(refusal.endpoint) + refusal.body + "}", adder());
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, refusal.param);
    EXPECT_TRUE(error.message.starts_with(refusal.param + ": ")) << error.message;
    EXPECT_TRUE(contains(error.message, refusal.mention)) << error.message;
  }
}

TEST_F(ServerRequest, TwoConstraintsAreRefusedNamingBoth) {
  const std::string schema =
      R"("response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}})";
  const std::vector<Refusal> refusals = {
      {Endpoint::kChat, schema + R"(, "guided_regex": "a")", "guided_regex",
       "response_format and guided_regex"},
      {Endpoint::kCompletions, R"("response_format": {"type": "json_object"}, "guided_json": {})",
       "guided_json", "response_format and guided_json"},
      {Endpoint::kCompletions, R"("guided_json": {}, "guided_choice": ["a"])", "guided_choice",
       "guided_json and guided_choice"},
      {Endpoint::kChat, R"("guided_choice": ["a"], "guided_grammar": "root ::= \"a\"")",
       "guided_grammar", "guided_choice and guided_grammar"},
      {Endpoint::kChat, R"("guided_regex": "a", "structured_outputs": {"json": {}})",
       "structured_outputs.json", "guided_regex and structured_outputs.json"},
      {Endpoint::kChat, R"("structured_outputs": {"regex": "a", "choice": ["a"]})",
       "structured_outputs.choice", "structured_outputs.regex and structured_outputs.choice"},
      {Endpoint::kCompletions, R"("structured_outputs": {"grammar": "g", "json_object": true})",
       "structured_outputs.json_object",
       "structured_outputs.grammar and structured_outputs.json_object"},
  };
  for (const Refusal& refusal : refusals) {
    SCOPED_TRACE(refusal.body);
    const ApiError error =
        refuse(refusal.endpoint, head(refusal.endpoint) + refusal.body + "}", adder());
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, refusal.param);
    EXPECT_TRUE(contains(error.message, refusal.mention)) << error.message;
    EXPECT_TRUE(contains(error.message, "one constraint per request")) << error.message;
  }
}

}  // namespace
}  // namespace kvvm::server::request_test
