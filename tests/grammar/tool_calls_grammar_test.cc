// grammar_from_tool_calls: exactly the well-formed calls of the offered tools (names, argument
// schemas, counts, the family's open / between / close), its refusals naming the tool, and the
// kToolCalls constraint through grammar_of and the cache.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kvvm/grammar/constraint.h"
#include "kvvm/grammar/grammar_cache.h"
#include "kvvm/grammar/matcher.h"
#include "kvvm/grammar/vocabulary.h"
#include "support/grammar_oracle.h"

namespace kvvm::grammar {
namespace {

using testing::oracle_accepts;
using testing::oracle_viable;

const char* const kWeatherSchema = R"({
  "type": "object",
  "properties": {
    "city": {"type": "string"},
    "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}
  },
  "required": ["city"],
  "additionalProperties": false
})";

// Qwen's spelling, one call unless told.
ToolCallsSpec hermes_spec(std::uint32_t min_calls = 1, std::uint32_t max_calls = 1) {
  ToolCallsSpec spec;
  spec.tools = {{"get_weather", kWeatherSchema}, {"get_time", "{}"}, {"ping", ""}};
  spec.open = "<tool_call>\n";
  spec.close = "\n</tool_call>";
  spec.between = "\n</tool_call>\n<tool_call>\n";
  spec.min_calls = min_calls;
  spec.max_calls = max_calls;
  return spec;
}

Grammar compiled(const ToolCallsSpec& spec, const JsonSchemaOptions& options = {}) {
  Result<Grammar> g = grammar_from_tool_calls(spec, options);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? std::move(*g) : Grammar();
}

std::string block(const std::string& call) { return "<tool_call>\n" + call + "\n</tool_call>"; }

TEST(ToolCallsGrammar, AcceptsExactlyTheWellFormedCall) {
  const Grammar g = compiled(hermes_spec());
  for (const std::string call : {
           R"({"name": "get_weather", "arguments": {"city": "Paris"}})",
           R"({"name":"get_weather","arguments":{"city":"Zürich","unit":"c","days":3}})",
           "{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"\", \"days\": 7}\n}",
           R"({"name": "get_time", "arguments": {"anything": [1, {"x": null}], "b": true}})",
           R"({"name": "get_time", "arguments": {}})",
           R"({"name": "ping", "arguments": {"n": 1}})",
       }) {
    EXPECT_TRUE(oracle_accepts(g, block(call))) << call;
  }
  for (const std::string call : {
           R"({"name": "get_weathr", "arguments": {"city": "Paris"}})",       // no such tool
           R"({"name": "get_weather", "arguments": {"city": 3}})",            // a number
           R"({"name": "get_weather", "arguments": {}})",                     // city required
           R"({"name": "get_weather", "arguments": {"city": "a", "x": 1}})",  // not allowed
           R"({"name": "get_weather", "arguments": {"city": "a", "days": 9}})",
           R"({"name": "get_weather", "arguments": {"city": "a", "unit": "k"}})",
           R"({"arguments": {"city": "Paris"}, "name": "get_weather"})",   // name first
           R"({"name": "get_weather", "parameters": {"city": "Paris"}})",  // the family's key
           R"({"name": "get_weather", "arguments": {"city": "Paris"}, "id": "x"})",
           R"({"name": "get_time", "arguments": []})",  // an object
           R"({"name": "get_time"})",
       }) {
    EXPECT_FALSE(oracle_accepts(g, block(call))) << call;
  }
  const std::string good = R"({"name": "get_time", "arguments": {}})";
  EXPECT_FALSE(oracle_accepts(g, "<tool_call>\n" + good));                 // missing close
  EXPECT_FALSE(oracle_accepts(g, good + "\n</tool_call>"));                // missing open
  EXPECT_FALSE(oracle_accepts(g, "<tool_call>" + good + "</tool_call>"));  // the newlines
  EXPECT_FALSE(oracle_accepts(g, block(good) + "\n" + block(good)));       // one call only
  EXPECT_TRUE(oracle_viable(g, "<tool_call>\n{\"name\": \"get_"));
  EXPECT_FALSE(oracle_viable(g, "<tool_call>\n{\"name\": \"set_"));
}

TEST(ToolCallsGrammar, CallCounts) {
  const std::string a = R"({"name": "get_time", "arguments": {}})";
  const std::string b = R"({"name": "get_weather", "arguments": {"city": "Oslo"}})";
  const std::string two = block(a) + "\n" + block(b);
  const std::string three = two + "\n" + block(a);
  const Grammar any = compiled(hermes_spec(1, 0));
  EXPECT_TRUE(oracle_accepts(any, block(a)));
  EXPECT_TRUE(oracle_accepts(any, two));
  EXPECT_TRUE(oracle_accepts(any, three));
  EXPECT_FALSE(oracle_accepts(any, ""));
  EXPECT_FALSE(oracle_accepts(any, block(a) + block(b)));  // `between` is "\n" apart
  const Grammar up_to_two = compiled(hermes_spec(1, 2));
  EXPECT_TRUE(oracle_accepts(up_to_two, two));
  EXPECT_FALSE(oracle_accepts(up_to_two, three));
  const Grammar two_or_more = compiled(hermes_spec(2, 0));
  EXPECT_FALSE(oracle_accepts(two_or_more, block(a)));
  EXPECT_TRUE(oracle_accepts(two_or_more, three));
}

TEST(ToolCallsGrammar, ArrayFamilyAndAfterOpen) {
  ToolCallsSpec spec = hermes_spec(1, 0);
  spec.open = "[TOOL_CALLS][";
  spec.close = "]";
  spec.between = ", ";
  const std::string a = R"({"name": "get_time", "arguments": {}})";
  const Grammar mistral = compiled(spec);
  EXPECT_TRUE(oracle_accepts(mistral, "[TOOL_CALLS][" + a + "]"));
  EXPECT_TRUE(oracle_accepts(mistral, "[TOOL_CALLS][" + a + ", " + a + "]"));
  EXPECT_FALSE(oracle_accepts(mistral, "[TOOL_CALLS][" + a + "], [TOOL_CALLS][" + a + "]"));
  spec.after_open = true;
  const Grammar after = compiled(spec);
  EXPECT_TRUE(oracle_accepts(after, a + ", " + a + "]"));
  EXPECT_FALSE(oracle_accepts(after, "[TOOL_CALLS][" + a + "]"));
  // Llama's: no tags, "parameters", calls apart by "; ".
  ToolCallsSpec llama = hermes_spec(1, 0);
  llama.open = llama.close = "";
  llama.between = "; ";
  llama.arguments_key = "parameters";
  const std::string p = R"({"name": "get_weather", "parameters": {"city": "Rome"}})";
  const Grammar l = compiled(llama);
  EXPECT_TRUE(oracle_accepts(l, p));
  EXPECT_TRUE(oracle_accepts(l, p + "; " + p));
  EXPECT_FALSE(oracle_accepts(l, R"({"name": "get_weather", "arguments": {"city": "Rome"}})"));
}

TEST(ToolCallsGrammar, CompactWhitespaceAndStrict) {
  ToolCallsSpec spec = hermes_spec();
  spec.whitespace.flexible = false;
  const Grammar compact = compiled(spec);
  EXPECT_TRUE(oracle_accepts(compact, block(R"({"name":"get_weather","arguments":{"city":"x"}})")));
  EXPECT_FALSE(
      oracle_accepts(compact, block(R"({"name": "get_weather", "arguments": {"city": "x"}})")));
  // Strict: properties not listed are refused even where the schema leaves them open.
  ToolCallsSpec open_schema = hermes_spec();
  open_schema.tools = {{"f", R"({"type": "object", "properties": {"a": {"type": "string"}}})"}};
  const std::string extra = block(R"({"name": "f", "arguments": {"a": "x", "b": 1}})");
  EXPECT_TRUE(oracle_accepts(compiled(open_schema), extra));
  EXPECT_FALSE(oracle_accepts(
      compiled(open_schema, {.whitespace = {}, .strict = true, .limits = {}}), extra));
}

// A parameters schema's $ref resolves against that schema, not against the calls.
TEST(ToolCallsGrammar, RefsResolveInTheirOwnTool) {
  ToolCallsSpec spec = hermes_spec();
  spec.tools = {{"a", R"({"type": "object", "properties": {"x": {"$ref": "#/$defs/n"}},
                          "required": ["x"], "$defs": {"n": {"type": "integer"}}})"},
                {"b", R"({"type": "object", "properties": {"x": {"$ref": "#/$defs/n"}},
                          "required": ["x"], "$defs": {"n": {"type": "string"}}})"}};
  const Grammar g = compiled(spec);
  EXPECT_TRUE(oracle_accepts(g, block(R"({"name": "a", "arguments": {"x": 1}})")));
  EXPECT_TRUE(oracle_accepts(g, block(R"({"name": "b", "arguments": {"x": "1"}})")));
  EXPECT_FALSE(oracle_accepts(g, block(R"({"name": "a", "arguments": {"x": "1"}})")));
  EXPECT_FALSE(oracle_accepts(g, block(R"({"name": "b", "arguments": {"x": 1}})")));
}

TEST(ToolCallsGrammar, RefusalsNameTheTool) {
  ToolCallsSpec spec = hermes_spec();
  spec.tools.push_back({"bad_tool", R"({"type": "object", "if": {"type": "string"}})"});
  Result<Grammar> g = grammar_from_tool_calls(spec);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      g.status().message().starts_with("tools[3] (bad_tool).function.parameters: schema at "))
      << g.status().message();
  EXPECT_NE(g.status().message().find("\"if\""), std::string::npos) << g.status().message();

  spec.tools.back().parameters_json = "{not json";
  g = grammar_from_tool_calls(spec);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(g.status().message().starts_with("tools[3] (bad_tool).function.parameters: "))
      << g.status().message();

  ToolCallsSpec twice = hermes_spec();
  twice.tools.push_back({"ping", "{}"});
  EXPECT_FALSE(grammar_from_tool_calls(twice).ok());
  ToolCallsSpec none = hermes_spec();
  none.tools.clear();
  EXPECT_FALSE(grammar_from_tool_calls(none).ok());
  EXPECT_FALSE(grammar_from_tool_calls(hermes_spec(0, 1)).ok());
  EXPECT_FALSE(grammar_from_tool_calls(hermes_spec(3, 2)).ok());
  ToolCallsSpec unnamed = hermes_spec();
  unnamed.tools[1].name.clear();
  EXPECT_FALSE(grammar_from_tool_calls(unnamed).ok());
}

// Every byte a token, and one end token.
std::shared_ptr<const Vocabulary> byte_vocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  bytes.emplace_back("</s>");
  std::vector<bool> special(bytes.size(), false);
  special.back() = true;
  const std::vector<TokenId> ends{256};
  return *Vocabulary::from_bytes(std::move(bytes), std::move(special), ends);
}

TEST(ToolCallsGrammar, ConstraintKindThroughTheCache) {
  EXPECT_EQ(to_string(Constraint::Kind::kToolCalls), "tool_calls");
  Constraint constraint;
  constraint.kind = Constraint::Kind::kToolCalls;
  constraint.tool_calls = hermes_spec();
  ASSERT_TRUE(grammar_of(constraint).ok());

  GrammarCache cache(byte_vocabulary());
  auto first = cache.get(constraint);
  ASSERT_TRUE(first.ok()) << first.status().message();
  Matcher m(*first);
  EXPECT_EQ(m.forced_bytes(), "<tool_call>\n{");
  EXPECT_TRUE(m.accept_bytes(block(R"({"name": "ping", "arguments": {}})")));
  EXPECT_TRUE(m.must_end());
  ASSERT_TRUE(cache.get(constraint).ok());
  EXPECT_EQ(cache.stats().hits, 1u);
  // Every part of the spec is part of the key.
  std::vector<Constraint> variants(8, constraint);
  variants[0].tool_calls.tools[0].name = "get_weather2";
  variants[1].tool_calls.tools[1].parameters_json = R"({"type": "object"})";
  variants[2].tool_calls.open = "<call>";
  variants[3].tool_calls.between = "\n";
  variants[4].tool_calls.max_calls = 0;
  variants[5].tool_calls.after_open = true;
  variants[6].tool_calls.whitespace.flexible = false;
  variants[7].tool_calls.arguments_key = "parameters";
  for (const Constraint& variant : variants) ASSERT_TRUE(cache.get(variant).ok());
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().compiled, 9u);
}

}  // namespace
}  // namespace kvvm::grammar
