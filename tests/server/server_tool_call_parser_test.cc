// The tool-call parser per family (hermes, llama3_json, mistral): fixtures of whole answers,
// and the same answers streamed in every split (byte by byte, random chunks, two pieces cut
// anywhere: inside tags and inside UTF-8 characters), whose deltas, accumulated as the OpenAI
// SDKs do, must equal the whole answer's parse and obey the SDKs' rule.
#include <gtest/gtest.h>

#include <cctype>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"
#include "tokenizer/utf8.h"

namespace kvvm::server::tool_call_parser_test {
namespace {

ToolCallIds counter_ids() {
  auto next = std::make_shared<int>(0);
  return [next] { return "call_" + std::to_string((*next)++); };
}

bool well_formed_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = tokenizer::detail::utf8_length(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

struct Expected {
  std::string name;
  std::string arguments;
};

struct Fixture {
  const char* label;
  ToolCallFormat format;
  std::string text;
  std::string content;
  std::vector<Expected> calls;
};

// Accumulates deltas as the OpenAI SDKs do, checking their rule on the way: a call's first
// delta has its index (the next one: 0, 1, ...), id and name; later ones only arguments.
class Accumulator {
 public:
  void add(const AnswerDelta& delta, const std::string& where) {
    EXPECT_TRUE(well_formed_utf8(delta.content)) << where << ": content piece not UTF-8";
    answer_.content += delta.content;
    for (const ToolCallDelta& call : delta.calls) {
      ASSERT_LE(call.index, answer_.calls.size()) << where << ": index skips ahead";
      if (call.index == answer_.calls.size()) {
        EXPECT_FALSE(call.id.empty()) << where << ": first delta of call " << call.index;
        EXPECT_FALSE(call.name.empty()) << where << ": first delta of call " << call.index;
        answer_.calls.push_back({call.id, call.name, call.arguments});
      } else {
        EXPECT_TRUE(call.id.empty()) << where << ": id again in call " << call.index;
        EXPECT_TRUE(call.name.empty()) << where << ": name again in call " << call.index;
        EXPECT_EQ(call.index + 1, answer_.calls.size()) << where << ": an earlier call resumed";
        answer_.calls[call.index].arguments += call.arguments;
      }
    }
  }
  const ParsedAnswer& answer() const { return answer_; }

 private:
  ParsedAnswer answer_;
};

ParsedAnswer stream(ToolCallFormat format, std::string_view text,
                    const std::vector<std::size_t>& cuts, const std::string& where) {
  ToolCallStream parser(format, counter_ids());
  Accumulator sum;
  std::size_t at = 0;
  for (std::size_t cut : cuts) {
    sum.add(parser.push(text.substr(at, cut - at)), where);
    at = cut;
  }
  sum.add(parser.push(text.substr(at)), where);
  sum.add(parser.finish(), where);
  return sum.answer();
}

void expect_same(const ParsedAnswer& got, const ParsedAnswer& want, const std::string& where) {
  EXPECT_EQ(got.content, want.content) << where;
  ASSERT_EQ(got.calls.size(), want.calls.size()) << where;
  for (std::size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].id, want.calls[i].id) << where << " call " << i;
    EXPECT_EQ(got.calls[i].name, want.calls[i].name) << where << " call " << i;
    EXPECT_EQ(got.calls[i].arguments, want.calls[i].arguments) << where << " call " << i;
  }
}

// Every split of `text` streams to `whole`.
void expect_every_split(ToolCallFormat format, const std::string& text, const ParsedAnswer& whole,
                        const std::string& label) {
  expect_same(stream(format, text, {}, label + " in one push"), whole, label + " in one push");
  std::vector<std::size_t> bytes;
  for (std::size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  expect_same(stream(format, text, bytes, label), whole, label + " byte by byte");
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    const std::string where = label + " cut at " + std::to_string(cut);
    expect_same(stream(format, text, {cut}, where), whole, where);
  }
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::size_t> cuts;
    for (std::size_t at = 0;;) {
      at += 1 + rng() % 7;
      if (at >= text.size()) break;
      cuts.push_back(at);
    }
    const std::string where = label + " seed " + std::to_string(seed);
    expect_same(stream(format, text, cuts, where), whole, where);
  }
}

const std::string kWeather =
    R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}})";

std::vector<Fixture> fixtures() {
  const auto H = ToolCallFormat::kHermes;
  const auto L = ToolCallFormat::kLlama3Json;
  const auto M = ToolCallFormat::kMistral;
  const std::string weather_args = R"({"city": "Paris", "unit": "celsius"})";
  return {
      // hermes
      {"hermes content only",
       H,
       "The weather in Paris is mild.",
       "The weather in Paris is mild.",
       {}},
      {"hermes one call",
       H,
       "<tool_call>\n" + kWeather + "\n</tool_call>",
       "",
       {{"get_weather", weather_args}}},
      {"hermes compact model spacing",
       H,
       "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1,\"b\":[1,2.5,{\"c\":null}],\"d\":true}}"
       "\n</tool_call>",
       "",
       {{"f", R"({"a": 1, "b": [1, 2.5, {"c": null}], "d": true})"}}},
      {"hermes parallel",
       H,
       "<tool_call>\n" + kWeather +
           "\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": "
           "\"CET\"}}\n</tool_call>",
       "",
       {{"get_weather", weather_args}, {"get_time", R"({"tz": "CET"})"}}},
      {"hermes content before",
       H,
       "Let me look that up.\n<tool_call>\n" + kWeather + "\n</tool_call>",
       "Let me look that up.\n",
       {{"get_weather", weather_args}}},
      {"hermes blanks around calls",
       H,
       "\n\n<tool_call>\n" + kWeather + "\n</tool_call>\n \n",
       "",
       {{"get_weather", weather_args}}},
      {"hermes text after a call",
       H,
       "<tool_call>\n" + kWeather + "\n</tool_call>\nDone.",
       "\nDone.",
       {{"get_weather", weather_args}}},
      {"hermes malformed json",
       H,
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>",
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>",
       {}},
      {"hermes truncated by max_tokens",
       H,
       "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
       "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
       {}},
      {"hermes unclosed block with whole json",
       H,
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n",
       "",
       {{"f", "{}"}}},
      {"hermes good call then a bad one",
       H,
       "<tool_call>\n" + kWeather + "\n</tool_call>\n<tool_call>\n{\"name\": 3}\n</tool_call>",
       "\n<tool_call>\n{\"name\": 3}\n</tool_call>",
       {{"get_weather", weather_args}}},
      {"hermes no arguments key",
       H,
       "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
       "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
       {}},
      {"hermes unicode in arguments",
       H,
       "Voilà 😀\n<tool_call>\n{\"name\": \"translate\", \"arguments\": {\"text\": "
       "\"Zürich – 東京 😀\", \"escaped\": \"\\u00e9\\n\\\"q\\\"\"}}\n</tool_call>",
       "Voilà 😀\n",
       {{"translate", R"({"text": "Zürich – 東京 😀", "escaped": "é\n\"q\""})"}}},
      {"hermes nested arguments",
       H,
       "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"filter\": {\"and\": [{\"x\": "
       "{\"gt\": "
       "1.5}}, {\"y\": \"a}b{\"}]}, \"limit\": 10, \"tags\": []}}\n</tool_call>",
       "",
       {{"search",
         R"({"filter": {"and": [{"x": {"gt": 1.5}}, {"y": "a}b{"}]}, "limit": 10, "tags": []})"}}},
      {"hermes tag-like text",
       H,
       "a <tool b <tool_cal c </tool_call> <",
       "a <tool b <tool_cal c </tool_call> <",
       {}},
      {"hermes parameters key",
       H,
       "<tool_call>{\"name\": \"f\", \"parameters\": {\"a\": 1}}</tool_call>",
       "",
       {{"f", R"({"a": 1})"}}},
      {"hermes numbers as Python writes them",
       H,
       R"(<tool_call>{"name": "f", "arguments": {"a": 1e999, "b": -0, "c": 1.50, "d": 1E2, "e": 12345678901234567890, "f": "\/", "g": -2.5e-3}}</tool_call>)",
       "",
       {{"f",
         R"({"a": 1e999, "b": 0, "c": 1.5, "d": 100.0, "e": 12345678901234567890, "f": "/", "g": -0.0025})"}}},
      {"hermes lone surrogate",
       H,
       R"(<tool_call>{"name": "f", "arguments": {"a": "\ud800"}}</tool_call>)",
       R"(<tool_call>{"name": "f", "arguments": {"a": "\ud800"}}</tool_call>)",
       {}},
      {"hermes repeated key",
       H,
       R"(<tool_call>{"name": "f", "arguments": {"a": 1, "b": 2, "a": 3}}</tool_call>)",
       "",
       {{"f", R"({"a": 3, "b": 2})"}}},
      {"hermes blanks only", H, " \n ", " \n ", {}},
      // llama3_json
      {"llama content only",
       L,
       "Paris is the capital of France.",
       "Paris is the capital of France.",
       {}},
      {"llama one call",
       L,
       R"({"name": "get_weather", "parameters": {"city": "Paris"}})",
       "",
       {{"get_weather", R"({"city": "Paris"})"}}},
      {"llama python tag",
       L,
       R"(<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}})",
       "",
       {{"get_weather", R"({"city": "Paris"})"}}},
      {"llama semicolon separated",
       L,
       R"({"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {"y": [2, 3]}})",
       "",
       {{"a", R"({"x": 1})"}, {"b", R"({"y": [2, 3]})"}}},
      {"llama python tag and three calls",
       L,
       R"(<|python_tag|>{"name": "a", "parameters": {}};{"name": "b", "arguments": {}} ; {"name": "c", "parameters": {"s": ";"}})",
       "",
       {{"a", "{}"}, {"b", "{}"}, {"c", R"({"s": ";"})"}}},
      {"llama leading blanks",
       L,
       "\n {\"name\": \"f\", \"parameters\": {\"q\": \"ü\"}}\n",
       "",
       {{"f", R"({"q": "ü"})"}}},
      {"llama json that is no call", L, R"({"answer": 42})", R"({"answer": 42})", {}},
      {"llama truncated",
       L,
       R"({"name": "f", "parameters": {"a": "b)",
       R"({"name": "f", "parameters": {"a": "b)",
       {}},
      {"llama text first",
       L,
       R"(Sure: {"name": "f", "parameters": {}})",
       R"(Sure: {"name": "f", "parameters": {}})",
       {}},
      {"llama text after a call",
       L,
       R"({"name": "f", "parameters": {}} and more)",
       " and more",
       {{"f", "{}"}}},
      {"llama bad second call",
       L,
       R"({"name": "f", "parameters": {}}; {"nom": 1})",
       R"(; {"nom": 1})",
       {{"f", "{}"}}},
      {"llama tag-like text", L, "<|python is a language", "<|python is a language", {}},
      // mistral
      {"mistral content only", M, "Bonjour !", "Bonjour !", {}},
      {"mistral one call",
       M,
       "[TOOL_CALLS][" + kWeather + "]",
       "",
       {{"get_weather", weather_args}}},
      {"mistral array of calls",
       M,
       R"([TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1, {"y": "]"}]}, "id": "abcdefghi"}])",
       "",
       {{"a", "{}"}, {"b", R"({"x": [1, {"y": "]"}]})"}}},
      {"mistral content before",
       M,
       "Checking.[TOOL_CALLS][" + kWeather + "]",
       "Checking.",
       {{"get_weather", weather_args}}},
      {"mistral malformed",
       M,
       R"([TOOL_CALLS][{"name": "f", "arguments": {]}])",
       R"([TOOL_CALLS][{"name": "f", "arguments": {]}])",
       {}},
      {"mistral truncated after a call",
       M,
       R"([TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g")",
       R"(, {"name": "g")",
       {{"f", R"({"a": 1})"}}},
      {"mistral no array", M, "[TOOL_CALLS] oops", "[TOOL_CALLS] oops", {}},
      {"mistral unicode",
       M,
       R"([TOOL_CALLS][{"name": "say", "arguments": {"t": "ça 😀"}}])",
       "",
       {{"say", R"({"t": "ça 😀"})"}}},
  };
}

TEST(ToolCallParser, FixturesParseAsExpected) {
  for (const Fixture& f : fixtures()) {
    const ParsedAnswer got = parse_tool_calls(f.format, f.text, counter_ids());
    EXPECT_EQ(got.content, f.content) << f.label;
    ASSERT_EQ(got.calls.size(), f.calls.size()) << f.label;
    for (std::size_t i = 0; i < f.calls.size(); ++i) {
      EXPECT_EQ(got.calls[i].id, "call_" + std::to_string(i)) << f.label;
      EXPECT_EQ(got.calls[i].name, f.calls[i].name) << f.label;
      EXPECT_EQ(got.calls[i].arguments, f.calls[i].arguments) << f.label;
    }
  }
}

TEST(ToolCallParser, EverySplitStreamsToTheWholeParse) {
  for (const Fixture& f : fixtures()) {
    expect_every_split(f.format, f.text, parse_tool_calls(f.format, f.text, counter_ids()),
                       f.label);
  }
}

// Random soups of the pieces a parser decides on (tags, braces, quotes, separators, blanks,
// whole calls, multi-byte characters): however the text is cut, the stream reads it the same.
TEST(ToolCallParser, RandomTextsStreamTheSameInEverySplit) {
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "[TOOL_CALLS]",
                                           "<|python_tag|>",
                                           "<tool",
                                           "[TOOL",
                                           "\n",
                                           " ",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"",
                                           "\\",
                                           ",",
                                           ";",
                                           ":",
                                           R"("name")",
                                           R"("arguments")",
                                           R"("parameters")",
                                           R"("f")",
                                           "1",
                                           "x",
                                           "é",
                                           "😀",
                                           kWeather,
                                           R"({"name": "g", "parameters": {"a": [1, "}"]}})"};
  std::mt19937_64 rng(2024);
  for (ToolCallFormat format :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    for (int i = 0; i < 300; ++i) {
      std::string text;
      for (std::size_t n = 1 + rng() % 12; n > 0; --n) text += pieces[rng() % pieces.size()];
      const ParsedAnswer whole = parse_tool_calls(format, text, counter_ids());
      const std::string label = std::string(to_string(format)) + " \"" + text + "\"";
      std::vector<std::size_t> bytes;
      for (std::size_t k = 1; k < text.size(); ++k) bytes.push_back(k);
      expect_same(stream(format, text, bytes, label), whole, label + " byte by byte");
      std::vector<std::size_t> cuts;
      for (std::size_t at = 0;;) {
        at += 1 + rng() % 9;
        if (at >= text.size()) break;
        cuts.push_back(at);
      }
      expect_same(stream(format, text, cuts, label), whole, label + " random cuts");
      if (HasFailure()) return;
    }
  }
}

// The family's own spelling (syntax_of, as its template writes calls) parses back.
TEST(ToolCallParser, SyntaxOfEachFamilyParsesBack) {
  for (ToolCallFormat format :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    const ToolCallSyntax s = syntax_of(format);
    const std::string text = s.open + R"({"name": "a", ")" + s.arguments_key + R"(": {"x": 1}})" +
                             s.between + R"({"name": "b", ")" + s.arguments_key + R"(": {}})" +
                             s.close;
    const ParsedAnswer got = parse_tool_calls(format, text, counter_ids());
    EXPECT_EQ(got.content, "") << to_string(format);
    ASSERT_EQ(got.calls.size(), 2u) << to_string(format) << ": " << text;
    EXPECT_EQ(got.calls[0].arguments, R"({"x": 1})");
    EXPECT_EQ(got.calls[1].name, "b");
    EXPECT_TRUE(s.trigger.empty() || text.starts_with(s.trigger));
  }
  // Qwen2.5's and Qwen3's templates: '<tool_call>\n{"name": ' ... '}\n</tool_call>', calls
  // apart by "\n".
  EXPECT_EQ(syntax_of(ToolCallFormat::kHermes).open, "<tool_call>\n");
  EXPECT_EQ(syntax_of(ToolCallFormat::kHermes).close, "\n</tool_call>");
  EXPECT_EQ(syntax_of(ToolCallFormat::kHermes).between, "\n</tool_call>\n<tool_call>\n");
  EXPECT_EQ(syntax_of(ToolCallFormat::kLlama3Json).arguments_key, "parameters");
  EXPECT_EQ(syntax_of(ToolCallFormat::kLlama3Json).trigger, "");
  EXPECT_EQ(syntax_of(ToolCallFormat::kMistral).open, "[TOOL_CALLS][");
}

TEST(ToolCallParser, ContentStreamsAtOnceAndOnlyTagPrefixesWait) {
  ToolCallStream parser(ToolCallFormat::kHermes, counter_ids());
  EXPECT_EQ(parser.push("Hello ").content, "Hello ");
  EXPECT_TRUE(parser.push("<tool").empty());
  EXPECT_EQ(parser.push("s are fun <").content, "<tools are fun ");
  EXPECT_TRUE(parser.push("tool_call>\n{\"name\": \"f\", ").empty());
  EXPECT_TRUE(parser.push("\"arguments\": {}}\n</tool_call").empty());
  const AnswerDelta call = parser.push(">");
  ASSERT_EQ(call.calls.size(), 1u);
  EXPECT_EQ(call.calls[0].index, 0u);
  EXPECT_EQ(call.calls[0].id, "call_0");
  EXPECT_EQ(call.calls[0].name, "f");
  EXPECT_EQ(call.calls[0].arguments, "{}");
  EXPECT_TRUE(parser.finish().empty());
}

TEST(ToolCallParser, ObjectCallsComeOutWhenTheirObjectCloses) {
  ToolCallStream llama(ToolCallFormat::kLlama3Json, counter_ids());
  EXPECT_TRUE(llama.push(R"({"name": "a", "parameters": {"x": "}"})").empty());
  EXPECT_EQ(llama.push("}").calls.size(), 1u);
  EXPECT_TRUE(llama.push(R"(; {"name": "b", "parameters": {}})").calls.size() == 1);
  ToolCallStream mistral(ToolCallFormat::kMistral, counter_ids());
  EXPECT_EQ(mistral.push("[TOOL_CALLS][" + kWeather).calls.size(), 1u);
  EXPECT_TRUE(mistral.push("]").empty());
  EXPECT_TRUE(mistral.finish().empty());
}

TEST(ToolCallParser, IncompleteUtf8WaitsForItsLastByte) {
  const std::string text = "é😀";
  ToolCallStream parser(ToolCallFormat::kMistral, counter_ids());
  EXPECT_EQ(parser.push(text.substr(0, 1)).content, "");
  EXPECT_EQ(parser.push(text.substr(1, 2)).content, "é");
  EXPECT_EQ(parser.push(text.substr(3)).content, "😀");
}

TEST(ToolCallParser, FormatNames) {
  for (ToolCallFormat format :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    auto parsed = parse_tool_call_format(to_string(format));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, format);
  }
  EXPECT_EQ(*parse_tool_call_format("llama4_json"), ToolCallFormat::kLlama3Json);
  const auto unknown = parse_tool_call_format("qwen");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("hermes, llama3_json"), std::string::npos)
      << unknown.status().message();
}

TEST(ToolCallParser, DetectsTheFamilyFromTheTemplate) {
  // Pieces of the real templates (Qwen2.5's, Mistral Nemo's, Llama 3.1's tool template).
  EXPECT_EQ(
      detect_tool_call_format(
          R"({{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }})"),
      ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(R"({{- "[TOOL_CALLS][" }}{%- for tool_call in tool_calls %})"),
            ToolCallFormat::kMistral);
  EXPECT_EQ(
      detect_tool_call_format(
          R"({{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }})"),
      ToolCallFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_call_format("{{- '<|python_tag|>' + tool_call.name }}"),
            ToolCallFormat::kLlama3Json);
  // Llama 3.1's template without tools, and ChatML without them.
  EXPECT_EQ(
      detect_tool_call_format(
          "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"),
      std::nullopt);
  EXPECT_EQ(detect_tool_call_format("{{ '<|im_start|>' + message.role }}"), std::nullopt);
}

TEST(ToolCallParser, RandomIdsLookAsTheirTemplatesWant) {
  const ToolCallIds ids = random_tool_call_ids();
  const std::string a = ids(), b = ids();
  EXPECT_NE(a, b);
  for (const std::string& id : {a, b}) {
    ASSERT_EQ(id.size(), 29u) << id;
    EXPECT_TRUE(id.starts_with("call_")) << id;
    for (char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
  }
  const std::string mistral = random_tool_call_ids(ToolCallFormat::kMistral)();
  ASSERT_EQ(mistral.size(), 9u);
  for (char c : mistral) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << mistral;
  EXPECT_TRUE(random_tool_call_ids(ToolCallFormat::kHermes)().starts_with("call_"));
}

TEST(ToolCallParser, SpecOfAFamily) {
  const grammar::ToolCallsSpec one =
      tool_calls_spec(ToolCallFormat::kMistral, {{"f", "{}"}}, /*parallel=*/false, false);
  EXPECT_EQ(one.open, "[TOOL_CALLS][");
  EXPECT_EQ(one.close, "]");
  EXPECT_EQ(one.between, ", ");
  EXPECT_EQ(one.min_calls, 1u);
  EXPECT_EQ(one.max_calls, 1u);
  ASSERT_EQ(one.tools.size(), 1u);
  const grammar::ToolCallsSpec any =
      tool_calls_spec(ToolCallFormat::kLlama3Json, {}, /*parallel=*/true, /*after_open=*/true);
  EXPECT_EQ(any.max_calls, 0u);
  EXPECT_EQ(any.arguments_key, "parameters");
  EXPECT_TRUE(any.after_open);
}

// The server's order: reasoning split off first, calls read from the content.
TEST(ToolCallParser, ReasoningThenCalls) {
  const std::string text =
      "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n" + kWeather + "\n</tool_call>";
  const ReasoningSplit split = split_reasoning(ReasoningFormat::kThinkTags, text);
  EXPECT_EQ(split.reasoning, "\nThe user wants weather.\n");
  const ParsedAnswer answer =
      parse_tool_calls(ToolCallFormat::kHermes, split.content, counter_ids());
  EXPECT_EQ(answer.content, "");
  ASSERT_EQ(answer.calls.size(), 1u);
  EXPECT_EQ(answer.calls[0].name, "get_weather");
}

}  // namespace
}  // namespace kvvm::server::tool_call_parser_test
