// Tools as the chat bodies send them: tools, tool_choice (none / auto / required / a named
// function) and parallel_tool_calls read together into what the answer must be (the tool-call
// grammar, or a trigger for auto) and how it is read (the template's tool-call format); the
// messages of a tool loop (an assistant's content null with tool_calls, role tool) rendered;
// every malformed tool or choice refused naming its field.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server_request_fixture.h"

namespace kvvm::server::request_test {
namespace {

using grammar::Constraint;

const std::string kUser = R"({"model": "m", "messages": [{"role": "user", "content": "a"}], )";
const std::string kAdd =
    R"({"type": "function", "function": {"name": "add", "description": "Adds",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
        "b": {"type": "integer"}}, "required": ["a", "b"]}}})";
const std::string kEcho =
    R"({"type": "function", "function": {"name": "echo", "parameters": {"type": "object",
        "properties": {"text": {"type": "string"}}}}})";

TEST_F(ServerRequest, ToolChoicesAreWhatTheAnswerMustBe) {
  const ParseContext ctx = adder_tools();
  {  // auto (the default with tools): read for calls, the grammar once a call is opened
    const ApiRequest r = accept(Endpoint::kChat, kUser + R"("tools": [)" + kAdd + "]}", ctx);
    ASSERT_TRUE(r.parsing.tool_calls.has_value());
    EXPECT_EQ(*r.parsing.tool_calls, ToolCallFormat::kHermes);
    ASSERT_TRUE(r.constraint.has_value());
    EXPECT_EQ(r.constraint->constraint.kind, Constraint::Kind::kToolCalls);
    EXPECT_EQ(r.constraint->field, "tools");
    EXPECT_TRUE(r.constraint->constraint.tool_calls.after_open);
    EXPECT_EQ(r.engine.grammar_trigger, syntax_of(ToolCallFormat::kHermes).open);
  }
  {  // required: the calls are the answer, any number of them by default
    const ApiRequest r = accept(
        Endpoint::kChat,
        kUser + R"("tools": [)" + kAdd + "," + kEcho + R"(], "tool_choice": "required"})", ctx);
    ASSERT_TRUE(r.constraint.has_value());
    const grammar::ToolCallsSpec& spec = r.constraint->constraint.tool_calls;
    EXPECT_FALSE(spec.after_open);
    EXPECT_TRUE(r.engine.grammar_trigger.empty());
    EXPECT_EQ(spec.tools.size(), 2u);
    EXPECT_EQ(spec.min_calls, 1u);
    EXPECT_EQ(spec.max_calls, 0u);
  }
  {  // a named function, one call
    const ApiRequest r = accept(Endpoint::kChat,
                                kUser + R"("tools": [)" + kAdd + "," + kEcho +
                                    R"(], "parallel_tool_calls": false, "tool_choice":
                                    {"type": "function", "function": {"name": "echo"}}})",
                                ctx);
    ASSERT_TRUE(r.constraint.has_value());
    const grammar::ToolCallsSpec& spec = r.constraint->constraint.tool_calls;
    ASSERT_EQ(spec.tools.size(), 1u);
    EXPECT_EQ(spec.tools[0].name, "echo");
    EXPECT_EQ(spec.max_calls, 1u);
  }
  {  // none: tools shown to the model, never called
    const ApiRequest r = accept(
        Endpoint::kChat, kUser + R"("tools": [)" + kAdd + R"(], "tool_choice": "none"})", ctx);
    EXPECT_FALSE(r.parsing.tool_calls.has_value());
    EXPECT_FALSE(r.constraint.has_value());
  }
}

// Mistral opens calls with a special token ([TOOL_CALLS]): its answers keep special tokens in
// their text, as vLLM's mistral parser needs; other formats leave them out unless asked.
TEST_F(ServerRequest, SpecialTokensStayInTheTextWhereTheFormatSpellsCallsWithThem) {
  ParseContext ctx = adder_tools();
  const std::string body = kUser + R"("tools": [)" + kAdd + R"(], "tool_choice": "required"})";
  EXPECT_TRUE(accept(Endpoint::kChat, body, ctx).engine.skip_special_tokens);
  ctx.tool_call_format = ToolCallFormat::kMistral;
  const ApiRequest mistral = accept(Endpoint::kChat, body, ctx);
  EXPECT_FALSE(mistral.engine.skip_special_tokens);
  EXPECT_EQ(mistral.constraint->constraint.tool_calls.open, "[TOOL_CALLS][");
  EXPECT_FALSE(accept(Endpoint::kChat, kUser + R"("skip_special_tokens": false})", adder_tools())
                   .engine.skip_special_tokens);
}

TEST_F(ServerRequest, MalformedToolsAndChoicesAreRefusedNamingTheField) {
  const ParseContext ctx = adder_tools();
  const std::vector<Refusal> cases = {
      // OpenAI answers 400 to a required or named choice without tools.
      {Endpoint::kChat, kUser + R"("tool_choice": "required"})", "tool_choice", "needs tools"},
      {Endpoint::kChat,
       kUser + R"("tool_choice": {"type": "function", "function": {"name": "add"}}})",
       "tool_choice.function.name", "no tools"},
      {Endpoint::kChat,
       kUser + R"("tools": [)" + kAdd +
           R"(], "tool_choice": {"type": "function", "function": {"name": "sub"}}})",
       "tool_choice.function.name", "\"sub\" is not among"},
      {Endpoint::kChat, kUser + R"("tools": [)" + kAdd + R"(], "tool_choice": "sometimes"})",
       "tool_choice", "\"sometimes\""},
      {Endpoint::kChat, kUser + R"("tools": [{"type": "function", "function": {}}]})",
       "tools[0].function.name", "is required"},
      {Endpoint::kChat, kUser + R"("tools": [{"type": "retrieval"}]})", "tools[0].type",
       "\"function\""},
      {Endpoint::kChat, kUser + R"("tools": [{"type": "function", "function": {"name": "a b"}}]})",
       "tools[0].function.name", "letters, digits"},
      {Endpoint::kChat, kUser + R"("tools": [)" + kAdd + "," + kAdd + "]}",
       "tools[1].function.name", "names two tools"},
      {Endpoint::kChat,
       kUser + R"("tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})",
       "tools[0].function.parameters", "an object"},
      // An answer cannot be both the calls and a schema's JSON.
      {Endpoint::kChat,
       kUser + R"("tools": [)" + kAdd +
           R"(], "tool_choice": "required", "response_format": {"type": "json_object"}})",
       "tool_choice", "response_format"},
  };
  for (const Refusal& c : cases) {
    const ApiError e = refuse(c.endpoint, c.body, ctx);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_TRUE(contains(e.message, c.mention)) << c.body << " -> " << e.message;
  }
  // A template that shows no tool-call format: calls are refused, tools with none are fine.
  ParseContext plain = ctx;
  plain.tool_call_format.reset();
  const ApiError e = refuse(Endpoint::kChat, kUser + R"("tools": [)" + kAdd + "]}", plain);
  EXPECT_EQ(e.param, "tools");
  EXPECT_TRUE(contains(e.message, "--tool-call-parser")) << e.message;
  accept(Endpoint::kChat, kUser + R"("tools": [)" + kAdd + R"(], "tool_choice": "none"})", plain);
}

TEST_F(ServerRequest, AToolLoopsMessagesAreRendered) {
  const ParseContext ctx = adder_tools();
  // An assistant's content null beside its tool_calls, then the tool's result.
  const std::string loop = R"({"model": "m", "tools": [)" + kAdd +
                           R"(], "messages": [{"role": "user", "content": "What is 1 + 2?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
       "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "3"}]})";
  const ApiRequest r = accept(Endpoint::kChat, loop, ctx);
  const std::string text = adder_->decode(r.engine.prompt);
  EXPECT_TRUE(
      contains(text, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}"))
      << text;
  EXPECT_TRUE(contains(text, "<tool_response>\n3\n</tool_response>")) << text;
  EXPECT_TRUE(contains(text, "<tools>add</tools>")) << text;

  // What the template is handed, printed by a probe template: the tools in the client's key
  // order (the reader's JSON sorts keys), the arguments as an object.
  Result<tokenizer::ChatRenderer> probe =
      tokenizer::ChatRenderer::load(std::string(KVVM_TEST_DATA_DIR) + "/chat_templates/probe", "");
  ASSERT_TRUE(probe.ok()) << probe.status().to_string();
  ParseContext p = ctx;
  p.chat_renderer = &*probe;
  p.context_tokens = 4096;
  const std::string seen = adder_->decode(accept(Endpoint::kChat, loop, p).engine.prompt);
  EXPECT_TRUE(contains(seen,
                       "\"type\": \"function\",\n    \"function\": {\n      \"name\": "
                       "\"add\",\n      \"description\": \"Adds\""))
      << seen;
  // Content null reaches templates as "", as vLLM hands it (Qwen3's fails on null).
  EXPECT_TRUE(contains(seen, "[1:assistant] calls=")) << seen;
  EXPECT_TRUE(contains(seen, "\"arguments\": {\"a\": 1, \"b\": 2}")) << seen;
  EXPECT_TRUE(contains(seen, "[2:tool]3 id=call_1")) << seen;
}

TEST_F(ServerRequest, ToolSchemasNestDeeperThanSixteenLevels) {
  ParseContext ctx = adder_tools();
  ctx.context_tokens = 4096;  // the tools' text is in the prompt
  std::string schema = R"({"type": "string"})";
  for (int i = 0; i < 40; ++i) {
    schema = R"({"type": "object", "properties": {"x": )" + schema + "}}";
  }
  accept(Endpoint::kChat,
         kUser + R"("tool_choice": "none", "tools": [{"type": "function", "function": {"name":
                 "deep", "parameters": )" +
             schema + "}}]}",
         ctx);
  std::string deep = "1";
  for (int i = 0; i < 129; ++i) deep = "[" + deep + "]";
  const ApiError e = refuse(Endpoint::kChat, kUser + R"("metadata": {"a": )" + deep + "}}", ctx);
  EXPECT_TRUE(contains(e.message, "the limit of 128 levels")) << e.message;
}

// /tokenize renders what the chat endpoint renders: the tools, and the template's variables
// (enable_thinking through chat_template_kwargs, which Qwen3's template reads).
TEST_F(ServerRequest, TokenizeRendersToolsAndTemplateKwargs) {
  const ParseContext ctx = adder_tools();
  const auto tokens = [&](const ParseContext& c, const std::string& body) {
    std::variant<TokenizeRequest, ApiError> parsed = parse_tokenize(body, c);
    if (const ApiError* error = std::get_if<ApiError>(&parsed)) {
      ADD_FAILURE() << body << " -> " << error->message;
      return std::vector<std::int32_t>{};
    }
    return std::get<TokenizeRequest>(parsed).tokens;
  };
  const std::string messages = R"({"messages": [{"role": "user", "content": "a"}])";
  const std::vector<std::int32_t> plain = tokens(ctx, messages + "}");
  const std::vector<std::int32_t> with_tools =
      tokens(ctx, messages + R"(, "tools": [)" + kAdd + "]}");
  EXPECT_GT(with_tools.size(), plain.size() + 20);
  EXPECT_TRUE(contains(adder_->decode(with_tools), "<tools>")) << adder_->decode(with_tools);

  std::unique_ptr<Tokenizer> qwen3 = load_tokenizer(test::model_fixture_dir("qwen3-tiny"));
  Result<tokenizer::ChatRenderer> own =
      tokenizer::ChatRenderer::load(test::model_fixture_dir("qwen3-tiny"), "");
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  ParseContext q = context(qwen3.get(), ChatTemplate::kChatML);
  q.chat_renderer = &*own;
  q.context_tokens = 1024;
  const std::string thinking = qwen3->decode(tokens(q, messages + "}"));
  const std::string off = qwen3->decode(
      tokens(q, messages + R"(, "chat_template_kwargs": {"enable_thinking": false}})"));
  EXPECT_FALSE(contains(thinking, "</think>")) << thinking;
  EXPECT_TRUE(off.ends_with("<think>\n\n</think>\n\n")) << off;
  // The chat endpoint reads an answer to that prompt as not thinking.
  const ApiRequest chat = accept(
      Endpoint::kChat,
      R"({"model": "m", "messages": [{"role": "user", "content": "a"}], "chat_template_kwargs":
          {"enable_thinking": false}})",
      q);
  EXPECT_FALSE(chat.parsing.thinking);
}

}  // namespace
}  // namespace kvvm::server::request_test
