// A chat answer read into its parts and written as OpenAI writes them: reasoning, content and
// tool calls in a whole body (content null beside calls, finish_reason tool_calls) and in
// streamed deltas (a call's index, id, type and name first, then its arguments in pieces), the
// deltas of any split of the text adding up to the whole reading.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "server/answer_reader.h"
#include "server/openai_response.h"

namespace kvvm::server {
namespace {

using nlohmann::json;

ToolCallIds counter() {
  auto next = std::make_shared<int>(0);
  return [next] { return "call_" + std::to_string((*next)++); };
}

const AnswerParsing kHermesThinking{.tool_calls = ToolCallFormat::kHermes,
                                    .reasoning = ReasoningFormat::kThinkTags};
const std::string kAnswer =
    "<think>\nThe user wants a sum; add() does it.\n</think>\n\nLet me add them.\n"
    "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 482, \"b\": 39}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"echo\", \"arguments\": {\"text\": \"é\"}}\n</tool_call>";

TEST(ServerToolAnswer, AWholeAnswerIsReadIntoReasoningContentAndCalls) {
  const AssistantMessage m = read_answer(kHermesThinking, kAnswer, counter());
  EXPECT_EQ(m.reasoning, "\nThe user wants a sum; add() does it.\n");
  EXPECT_EQ(m.content, "Let me add them.\n");  // text beside calls is kept as written
  ASSERT_EQ(m.calls.size(), 2u);
  EXPECT_EQ(m.calls[0].id, "call_0");
  EXPECT_EQ(m.calls[0].name, "add");
  EXPECT_EQ(json::parse(m.calls[0].arguments), json({{"a", 482}, {"b", 39}}));
  EXPECT_EQ(m.calls[1].name, "echo");
  // Nothing to read for: the text is the content.
  EXPECT_EQ(read_answer(AnswerParsing{}, kAnswer, counter()).content, kAnswer);
}

TEST(ServerToolAnswer, TheBodyHasToolCallsAndContentNullAsOpenAIs) {
  AssistantMessage m;
  m.calls.push_back(ToolCall{"call_7", "add", R"({"a": 1})"});
  const ResponseHead head{
      .endpoint = Endpoint::kChat, .id = "chatcmpl-x", .created = 1, .model = "m"};
  ChoiceText choice;
  choice.finish = finish_reason(engine::RequestEnd::kStop, true);
  choice.message = &m;
  const json body = completion_body(head, std::span<const ChoiceText>(&choice, 1), Usage{});
  const json& message = body["choices"][0]["message"];
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["tool_calls"], json::parse(R"([{"id": "call_7", "type": "function",
                             "function": {"name": "add", "arguments": "{\"a\": 1}"}}])"));
  EXPECT_FALSE(message.contains("reasoning_content"));
  // Text and reasoning, no call: content is the text; a cut answer stays "length".
  m.calls.clear();
  m.content = "hi";
  m.reasoning = "r";
  choice.finish = finish_reason(engine::RequestEnd::kLength, false);
  const json plain = completion_body(head, std::span<const ChoiceText>(&choice, 1), Usage{});
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(plain["choices"][0]["message"]["reasoning_content"], "r");
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "length");
}

// Accumulates streamed chunks as the OpenAI SDKs do (ChatCompletionStream's accumulation):
// content and reasoning appended, a call's id / name taken from its first delta, arguments
// appended by index.
struct Accumulated {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  void add(const json& delta) {
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"];
    if (delta.contains("content") && delta["content"].is_string()) content += delta["content"];
    if (!delta.contains("tool_calls")) return;
    for (const json& piece : delta["tool_calls"]) {
      const std::size_t index = piece["index"];
      if (index == calls.size()) {
        ASSERT_TRUE(piece.contains("id")) << piece;  // a call's first delta names it
        calls.push_back(ToolCall{piece["id"], piece["function"]["name"], ""});
      }
      ASSERT_LT(index, calls.size()) << "indexes grow from 0 by 1: " << piece;
      if (index + 1 != calls.size()) ADD_FAILURE() << "an earlier call resumed: " << piece;
      if (piece.contains("id") && index + 1 == calls.size() && !calls[index].arguments.empty()) {
        ADD_FAILURE() << "a call named twice: " << piece;
      }
      calls[index].arguments += piece["function"]["arguments"].get<std::string>();
    }
  }
};

TEST(ServerToolAnswer, StreamedDeltasOfAnySplitAddUpToTheWholeReading) {
  const AssistantMessage whole = read_answer(kHermesThinking, kAnswer, counter());
  const ResponseHead head{
      .endpoint = Endpoint::kChat, .id = "chatcmpl-x", .created = 1, .model = "m"};
  std::mt19937 random(5);
  for (int split = 0; split < 60; ++split) {
    AnswerStream stream(kHermesThinking, counter());
    Accumulated got;
    bool first = true;
    std::size_t at = 0;
    while (at <= kAnswer.size()) {
      const std::size_t size = split == 0 ? 1 : 1 + random() % 9;
      const std::string piece = kAnswer.substr(at, size);
      at += size;
      const bool last = at >= kAnswer.size();
      AssistantDelta delta = stream.push(piece);
      if (last) delta.append(stream.finish());
      if (!delta.empty() || last) {
        ChoiceText choice;
        choice.delta = &delta;
        if (last) choice.finish = finish_reason(engine::RequestEnd::kStop, stream.called());
        const json chunk = stream_chunk(head, choice, first);
        const json& d = chunk["choices"][0]["delta"];
        if (first) {
          EXPECT_EQ(d["role"], "assistant");
        }
        got.add(d);
        if (last) {
          EXPECT_EQ(chunk["choices"][0]["finish_reason"], "tool_calls");
        }
        first = false;
      }
      if (last) break;
    }
    EXPECT_EQ(got.reasoning, whole.reasoning) << "split " << split;
    EXPECT_EQ(got.content, whole.content) << "split " << split;
    ASSERT_EQ(got.calls.size(), whole.calls.size()) << "split " << split;
    for (std::size_t i = 0; i < got.calls.size(); ++i) {
      EXPECT_EQ(got.calls[i].id, whole.calls[i].id);
      EXPECT_EQ(got.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(got.calls[i].arguments, whole.calls[i].arguments) << "split " << split;
    }
  }
}

}  // namespace
}  // namespace kvvm::server
