// The OpenAI request bodies' refusals: every one a 400 (404 for another model) naming the field
// at fault and its value once; what kvvm does not do said so; prompts past the context, JSON
// nested past the bound and a chat without a template refused in words that say why.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "server_request_fixture.h"

namespace kvvm::server::request_test {
namespace {

TEST_F(ServerRequest, EveryRefusalNamesItsField) {
  const Endpoint kC = Endpoint::kCompletions;
  const Endpoint kChat = Endpoint::kChat;
  const std::string c = R"({"model": "m", "prompt": "hi", )";
  const std::string ch = R"({"model": "m", "messages": [{"role": "user", "content": "a"}], )";
  const std::vector<Refusal> refusals = {
      {kC, R"({"model": "m", "prompt": )", "", "body"},
      {kC, R"({"model": "m", "prompt": "hi"} x)", "", "body"},
      {kC, "[1, 2]", "", "JSON object"},
      {kC, "", "", "body"},
      {kC, "{\"model\": \"m\", \"prompt\": \"a\xff\xfe\"}", "", "UTF-8"},
      {kC, R"({"prompt": "hi"})", "model", "required"},
      {kC, R"({"model": 5, "prompt": "hi"})", "model", "string"},
      {kC, R"({"model": "m"})", "prompt", "required"},
      {kC, R"({"model": "m", "prompt": ""})", "prompt", "empty"},
      {kC, R"({"model": "m", "prompt": []})", "prompt", "empty"},
      {kC, R"({"model": "m", "prompt": true})", "prompt", "boolean"},
      {kC, R"({"model": "m", "prompt": ["a", ""]})", "prompt[1]", "empty"},
      {kC, R"({"model": "m", "prompt": [[1], [2, -3]]})", "prompt[1][1]", "-3"},
      {kC, R"({"model": "m", "prompt": [""]})", "prompt[0]", "empty"},
      {kC, R"({"model": "m", "prompt": [[1, -1]]})", "prompt[0][1]", "-1"},
      {kC, R"({"model": "m", "prompt": [1, "a"]})", "prompt[1]", "string"},
      {kChat, R"({"model": "m", "messages": [{"role": "user", "content": "a", "name": 5}]})",
       "messages[0].name", "number"},
      {kC, c + R"("store": "yes"})", "store", "string"},
      {kC, c + R"("metadata": [1]})", "metadata", "array"},
      {kC, R"({"model": "m", "prompt": [1, 100000]})", "prompt[1]", "100000"},
      {kC, R"({"model": "m", "prompt": [1, -1]})", "prompt[1]", "-1"},
      {kC, R"({"model": "m", "prompt": [1, 2.5]})", "prompt[1]", "2.5"},
      {kC, c + R"("n": 17})", "n", "[1, 16] (the server's --max-n)"},
      {kC, c + R"("n": 0})", "n", "0"},
      {kC, c + R"("n": "1"})", "n", "string"},
      {kC, c + R"("n": 2, "max_tokens": 0, "echo": true})", "n", "max_tokens 0"},
      {kC, c + R"("best_of": 17})", "best_of", "17"},
      {kC, c + R"("logprobs": 21})", "logprobs", "21"},
      {kC, c + R"("logprobs": true})", "logprobs", "boolean"},
      {kC, c + R"("echo": 1})", "echo", "number"},
      {kChat, ch + R"("logprobs": 5})", "logprobs", "number"},
      {kChat, ch + R"("top_logprobs": 2})", "top_logprobs", "needs logprobs"},
      {kChat, ch + R"("logprobs": true, "top_logprobs": 21})", "top_logprobs", "21"},
      {kC, c + R"("suffix": "end"})", "suffix", "end"},
      {kC, c + R"("presence_penalty": 2.5})", "presence_penalty", "[-2, 2]"},
      {kC, c + R"("frequency_penalty": "1"})", "frequency_penalty", "string"},
      {kC, c + R"("repetition_penalty": 0})", "repetition_penalty", "(0, 10]"},
      {kC, c + R"("min_tokens": -1})", "min_tokens", "-1"},
      {kC, c + R"("min_tokens": 9, "max_tokens": 8})", "min_tokens", "exceeds max_tokens 8"},
      {kC, c + R"("logit_bias": {"5": 101}})", "logit_bias.5", "101"},
      {kC, c + R"("logit_bias": {"x": 1}})", "logit_bias.x", "not a token id"},
      {kC, c + R"("logit_bias": {"100000": 1}})", "logit_bias.100000", "not a token id"},
      {kC, c + R"("logit_bias": [1]})", "logit_bias", "array"},
      {kChat, ch + R"("tools": [{"type": "function"}]})", "tools[0].function", "is required"},
      {kC, c + R"("max_tokens": 1000000000000})", "max_tokens", "64"},
      {kC, c + R"("max_tokens": 18446744073709551616})", "max_tokens", "64"},
      {kC, c + R"("max_tokens": 18446744073709551615})", "max_tokens", "64"},
      {kC, c + R"("max_tokens": -5})", "max_tokens", "-5"},
      {kC, c + R"("max_tokens": 0})", "max_tokens", "0 only with echo"},
      {kChat, ch + R"("max_tokens": 0})", "max_tokens", "[1, 64]"},
      {kC, c + R"("max_tokens": 2.5})", "max_tokens", "2.5"},
      {kC, c + R"("max_tokens": "8"})", "max_tokens", "string"},
      {kC, c + R"("max_tokens": true})", "max_tokens", "boolean"},
      {kChat, ch + R"("max_tokens": 4, "max_completion_tokens": 5})", "max_completion_tokens",
       "differ"},
      {kChat, ch + R"("max_completion_tokens": 65})", "max_completion_tokens", "65"},
      {kC, c + R"("top_p": 0})", "top_p", "(0, 1]"},
      {kC, c + R"("top_p": 1.5})", "top_p", "1.5"},
      {kC, c + R"("temperature": -1})", "temperature", "[0, 2]"},
      {kC, c + R"("temperature": 3})", "temperature", "3"},
      {kC, c + R"("temperature": true})", "temperature", "boolean"},
      {kC, c + R"("temperature": "1"})", "temperature", "string"},
      {kC, c + R"("top_k": -2})", "top_k", "-2"},
      {kC, c + R"("top_k": 1.5})", "top_k", "1.5"},
      {kC, c + R"("top_k": 99999999999})", "top_k", "99999999999"},
      {kC, c + R"("seed": 1.5})", "seed", "1.5"},
      {kC, c + R"("seed": "7"})", "seed", "string"},
      {kC, c + R"("seed": 1e30})", "seed", "range"},
      {kC, c + R"("stop": ["a", "b", "c", "d", "e"]})", "stop", "at most 4"},
      {kC, c + R"("stop": ["a", "b", ""]})", "stop[2]", "0 bytes"},
      {kC, c + R"("stop": ""})", "stop", "0 bytes"},
      {kC, c + R"("stop": ["a", 5]})", "stop[1]", "number"},
      {kC, c + R"("stop": {"a": 1}})", "stop", "object"},
      {kC, c + R"("stop": ")" + std::string(257, 'x') + "\"}", "stop", "257 bytes"},
      {kC, c + R"("stream": "yes"})", "stream", "string"},
      {kC, c + R"("stream_options": {"include_usage": 1}})", "stream_options.include_usage",
       "number"},
      {kC, c + R"("user": 5})", "user", "number"},
      {kChat, R"({"model": "m"})", "messages", "required"},
      {kChat, R"({"model": "m", "messages": []})", "messages", "empty"},
      {kChat, R"({"model": "m", "messages": "hi"})", "messages", "string"},
      {kChat, R"({"model": "m", "messages": [5]})", "messages[0]", "object"},
      {kChat, R"({"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "robot",
          "content": "b"}]})",
       "messages[1].role", "robot"},
      {kChat, R"({"model": "m", "messages": [{"content": "a"}]})", "messages[0].role", "required"},
      {kChat, R"({"model": "m", "messages": [{"role": "user"}]})", "messages[0].content",
       "required"},
      {kChat, R"({"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "user",
          "content": 5}]})",
       "messages[1].content", "number"},
      {kChat, R"({"model": "m", "messages": [{"role": "user", "content": null}]})",
       "messages[0].content", "null"},
      {kChat, R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url",
          "image_url": {}}]}]})",
       "messages[0].content[0].type", "image_url"},
      {kChat, R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]})",
       "messages[0].content[0].text", "required"},
      {kChat, R"({"model": "m", "messages": [{"role": "user", "content": [{"text": "a"}]}]})",
       "messages[0].content[0].type", "required"},
      {kChat, R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text",
          "text": 7}]}]})",
       "messages[0].content[0].text", "number"},
  };
  for (const Refusal& refusal : refusals) {
    SCOPED_TRACE(refusal.body.substr(0, 200));
    const ApiError error = refuse(refusal.endpoint, refusal.body, adder());
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_EQ(error.param, refusal.param);
    if (!refusal.param.empty()) {
      EXPECT_TRUE(error.message.starts_with(refusal.param + ": ")) << error.message;
    }
    EXPECT_TRUE(contains(error.message, refusal.mention)) << error.message;
  }
}

// A refusal names the bad value once: a null is "not null", never "not null null".
TEST_F(ServerRequest, ARefusalNamesTheValueOnce) {
  const std::string c = R"({"model": "m", "prompt": "hi", )";
  const std::vector<Refusal> refusals = {
      {Endpoint::kChat, R"({"model": "m", "messages": [{"role": "user", "content": null}]})",
       "messages[0].content", "must be a string or an array, not null"},
      {Endpoint::kChat, R"({"model": "m", "messages": [null]})", "messages[0]",
       "must be an object, not null"},
      {Endpoint::kChat, R"({"model": "m", "messages": [{"role": "user", "content": [{"type":
          "text", "text": null}]}]})",
       "messages[0].content[0].text", "must be a string, not null"},
      {Endpoint::kCompletions, c + R"("stop": ["a", null]})", "stop[1]",
       "must be a string, not null"},
      {Endpoint::kCompletions, R"({"model": "m", "prompt": [1, null]})", "prompt[1]",
       "must be an integer, not null"},
      {Endpoint::kCompletions, c + R"("logit_bias": {"5": null}})", "logit_bias.5",
       "must be a number, not null"},
  };
  for (const Refusal& refusal : refusals) {
    SCOPED_TRACE(refusal.body);
    const ApiError error = refuse(refusal.endpoint, refusal.body, adder());
    EXPECT_EQ(error.param, refusal.param);
    EXPECT_EQ(error.message, refusal.param + ": " + refusal.mention);
  }
  // Other values still show themselves after their type.
  EXPECT_EQ(refuse(Endpoint::kCompletions, c + R"("temperature": "1"})", adder()).message,
            R"(temperature: must be a number, not string "1")");
}

// What kvvm reads but cannot honour is refused in words that say so, never "unknown field".
TEST_F(ServerRequest, WhatKvvmDoesNotDoIsNotSupportedByThisServer) {
  const std::string c = R"({"model": "m", "prompt": "hi", )";
  const std::string ch = R"({"model": "m", "messages": [{"role": "user", "content": "a"}], )";
  const std::vector<Refusal> refusals = {
      {Endpoint::kCompletions, c + R"("n": 2, "best_of": 3})", "best_of", "3"},
      {Endpoint::kChat, ch + R"("functions": [{"name": "f"}]})", "functions", "send them as tools"},
      {Endpoint::kChat, ch + R"("audio": {"voice": "alloy"}})", "audio", "text output only"},
      {Endpoint::kChat, ch + R"("modalities": ["text", "audio"]})", "modalities", "audio"},
      {Endpoint::kChat, R"({"model": "m", "messages": [{"role": "function", "content": "a"}]})",
       "messages[0].role", "send tool"},
      {Endpoint::kChat, R"({"model": "m", "messages": [{"role": "user", "content": [{"type":
          "image_url", "image_url": {}}]}]})",
       "messages[0].content[0].type", "image_url"},
  };
  for (const Refusal& refusal : refusals) {
    SCOPED_TRACE(refusal.body);
    const ApiError error = refuse(refusal.endpoint, refusal.body, adder());
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, refusal.param);
    EXPECT_TRUE(error.message.starts_with(refusal.param + ": ")) << error.message;
    EXPECT_TRUE(contains(error.message, "is not supported by this server")) << error.message;
    EXPECT_TRUE(contains(error.message, refusal.mention)) << error.message;
  }
}

TEST_F(ServerRequest, AnotherModelIsNotFound) {
  const ApiError error =
      refuse(Endpoint::kCompletions, R"({"model": "gpt-4", "prompt": "hi"})", adder());
  EXPECT_EQ(error.status, 404);
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_EQ(error.code, "model_not_found");
  EXPECT_EQ(error.param, "model");
  EXPECT_TRUE(contains(error.message, "gpt-4")) << error.message;
}

TEST_F(ServerRequest, DeepNestingIsABadRequestNotACrash) {
  constexpr int kDepth = 100000;
  const std::string body =
      R"({"model": "m", "prompt": )" + std::string(kDepth, '[') + std::string(kDepth, ']') + "}";
  const ApiError error = refuse(Endpoint::kCompletions, body, adder());
  EXPECT_EQ(error.status, 400);
  EXPECT_TRUE(contains(error.message, "body")) << error.message;
  EXPECT_TRUE(contains(error.message, "nested deeper")) << error.message;
}

TEST_F(ServerRequest, PromptPastTheContextNamesBothNumbers) {
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += "12 + 34 ";
  const std::size_t tokens = adder_->encode(long_text, true).size();
  ASSERT_GT(tokens, kContext);
  const ApiError completion =
      refuse(Endpoint::kCompletions, R"({"model": "m", "prompt": ")" + long_text + "\"}", adder());
  EXPECT_EQ(completion.param, "prompt");
  EXPECT_TRUE(contains(completion.message, std::to_string(tokens))) << completion.message;
  EXPECT_TRUE(contains(completion.message, std::to_string(kContext))) << completion.message;

  const ApiError chat =
      refuse(Endpoint::kChat,
             R"({"model": "m", "messages": [{"role": "user", "content": ")" + long_text + "\"}]}",
             adder());
  EXPECT_EQ(chat.param, "messages");
  const std::vector<ChatMessage> messages = {{"user", long_text}};
  Result<std::string> rendered = tokenizer::render_chat(ChatTemplate::kChatML, messages);
  ASSERT_TRUE(rendered.ok());
  const std::size_t chat_tokens = adder_->encode(*rendered, false).size();
  EXPECT_TRUE(contains(chat.message, std::to_string(chat_tokens))) << chat.message;
  EXPECT_TRUE(contains(chat.message, std::to_string(kContext))) << chat.message;

  // A prompt that fills the context exactly leaves nothing to generate.
  std::string ids = "[1";
  for (std::uint32_t i = 1; i < kContext; ++i) ids += ", 1";
  EXPECT_EQ(
      refuse(Endpoint::kCompletions, R"({"model": "m", "prompt": )" + ids + "]}", adder()).param,
      "prompt");
}

TEST_F(ServerRequest, PromptPlusMaxTokensPastTheContextNamesMaxTokens) {
  const std::string body = R"({"model": "m", "prompt": [1, 2, 3, 4], "max_tokens": 61})";
  const ApiError error = refuse(Endpoint::kCompletions, body, adder());
  EXPECT_EQ(error.param, "max_tokens");
  for (const char* number : {"61", "4", "64", "60"}) {
    EXPECT_TRUE(contains(error.message, number)) << error.message;
  }
  EXPECT_EQ(accept(Endpoint::kCompletions,
                   R"({"model": "m", "prompt": [1, 2, 3, 4], "max_tokens": 60})", adder())
                .engine.max_tokens,
            60u);
}

TEST_F(ServerRequest, ChatWithoutATemplateSaysHowToGiveOne) {
  ParseContext ctx = adder();
  ctx.chat_renderer = nullptr;
  const ApiError error = refuse(
      Endpoint::kChat, R"({"model": "m", "messages": [{"role": "user", "content": "a"}]})", ctx);
  EXPECT_EQ(error.param, "messages");
  EXPECT_TRUE(contains(error.message, "--chat-template")) << error.message;
  // Completions need no template.
  accept(Endpoint::kCompletions, R"({"model": "m", "prompt": "a"})", ctx);
}

TEST_F(ServerRequest, DepthBoundIsTheContexts) {
  ParseContext ctx = adder();
  ctx.max_json_depth = 2;
  const std::string body =
      R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]})";
  EXPECT_TRUE(contains(refuse(Endpoint::kChat, body, ctx).message, "nested deeper"));
  ctx.max_json_depth = 16;
  accept(Endpoint::kChat, body, ctx);
}

}  // namespace
}  // namespace kvvm::server::request_test
