// The grammar of a family's calls (tool_calls_spec + grammar_from_tool_calls) against its
// parser: random strings of the grammar (the oracle's sampler) parse with parse_tool_calls()
// into calls only, of the offered tools, whose arguments validate against the tool's schema
// (python3-jsonschema, independent of both).
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "server/tool_call_parser.h"
#include "support/grammar_oracle.h"
#include "support/json_validator.h"

namespace kvvm::server::tool_calls_grammar_test {
namespace {

const std::vector<ToolSpec> kTools = {
    {"get_weather", R"({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}},
      "required": ["city"], "additionalProperties": false})"},
    {"search", R"({"type": "object", "properties": {
        "query": {"type": "string", "maxLength": 8},
        "filters": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
            "field": {"type": "string", "maxLength": 5}, "exact": {"type": "boolean"}},
          "required": ["field"], "additionalProperties": false}},
        "limit": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100}, {"type": "null"}]}},
      "required": ["query", "filters"], "additionalProperties": false})"},
    {"get_time", "{}"},
};

ToolCallIds counter_ids() {
  auto next = std::make_shared<int>(0);
  return [next] { return "call_" + std::to_string((*next)++); };
}

TEST(ToolCallsGrammarSamples, ParseIntoValidCallsInEveryFamily) {
  std::map<std::string, std::vector<std::string>> arguments_of;  // tool -> sampled arguments
  std::set<std::string> names_seen;
  std::size_t parallel_seen = 0;
  for (ToolCallFormat format :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    for (bool parallel : {false, true}) {
      const grammar::ToolCallsSpec spec = tool_calls_spec(format, kTools, parallel, false);
      Result<grammar::Grammar> g = grammar::grammar_from_tool_calls(spec);
      ASSERT_TRUE(g.ok()) << g.status().message();
      std::mt19937_64 rng(parallel ? 7 : 3);
      for (int i = 0; i < 150; ++i) {
        const std::optional<std::string> text = grammar::testing::oracle_sample(*g, rng, 16);
        ASSERT_TRUE(text);
        const std::string where = std::string(to_string(format)) + ": " + *text;
        const ParsedAnswer answer = parse_tool_calls(format, *text, counter_ids());
        EXPECT_EQ(answer.content, "") << where;
        ASSERT_FALSE(answer.calls.empty()) << where;
        if (!parallel) {
          EXPECT_EQ(answer.calls.size(), 1u) << where;
        }
        parallel_seen += answer.calls.size() > 1;
        for (const ToolCall& call : answer.calls) {
          names_seen.insert(call.name);
          arguments_of[call.name].push_back(call.arguments);
        }
        // The stream reads it the same, however the text is cut.
        ToolCallStream stream(format, counter_ids());
        std::size_t calls = 0;
        for (std::size_t at = 0; at < text->size(); at += 3) {
          calls += stream.push(std::string_view(*text).substr(at, 3)).calls.size();
        }
        calls += stream.finish().calls.size();
        EXPECT_EQ(calls, answer.calls.size()) << where;
      }
    }
  }
  EXPECT_EQ(names_seen, (std::set<std::string>{"get_weather", "search", "get_time"}));
  EXPECT_GT(parallel_seen, 0u);
  if (!test::have_json_validator()) GTEST_SKIP() << "python3-jsonschema is not installed";
  for (const ToolSpec& tool : kTools) {
    const auto [status, output] = test::validate_json(
        tool.parameters_json == "{}" ? R"({"type": "object"})" : tool.parameters_json,
        arguments_of[tool.name]);
    EXPECT_EQ(status, 0) << tool.name << ": " << output;
  }
}

}  // namespace
}  // namespace kvvm::server::tool_calls_grammar_test
