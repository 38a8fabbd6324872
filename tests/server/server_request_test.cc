// The OpenAI request bodies: prompts become the ids `kvvm generate` would use, every field is
// read with its range checked, and every refusal is a 400 naming the field at fault.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kvvm/tokenizer/chat_template.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "server/openai_request.h"
#include "support/test_data.h"
#include "support/text_match.h"

namespace kvvm::server {
namespace {

using tokenizer::ChatMessage;
using tokenizer::ChatTemplate;
using tokenizer::Tokenizer;

constexpr std::uint32_t kContext = 64;
constexpr std::uint32_t kDefaultMaxTokens = 16;

using test::contains;

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::load(dir + "/tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

// The demo model (ChatML, no BOS) and llama-tiny (a BOS added by its post-processor).
class ServerRequest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    adder_ = load_tokenizer(test::demo_model_dir()).release();
    llama_ = load_tokenizer(test::model_fixture_dir("llama-tiny")).release();
  }
  static void TearDownTestSuite() {
    delete adder_;
    delete llama_;
  }

  static ParseContext context(const Tokenizer* tok, ChatTemplate kind) {
    ParseContext ctx;
    ctx.tokenizer = tok;
    ctx.chat_template = kind;
    ctx.model_name = "m";
    ctx.context_tokens = kContext;
    ctx.vocab_size = static_cast<std::uint32_t>(tok->vocab_size());
    ctx.default_max_tokens = kDefaultMaxTokens;
    return ctx;
  }
  static ParseContext adder() { return context(adder_, ChatTemplate::kChatML); }
  static ParseContext llama() { return context(llama_, ChatTemplate::kLlama3); }

  static ApiRequest accept(Endpoint endpoint, const std::string& body, const ParseContext& ctx) {
    std::variant<ApiRequest, ApiError> parsed = parse_request(endpoint, body, ctx);
    if (const ApiError* error = std::get_if<ApiError>(&parsed)) {
      ADD_FAILURE() << body << " -> " << error->message;
      return {};
    }
    return std::get<ApiRequest>(std::move(parsed));
  }
  static ApiError refuse(Endpoint endpoint, const std::string& body, const ParseContext& ctx) {
    std::variant<ApiRequest, ApiError> parsed = parse_request(endpoint, body, ctx);
    if (!std::holds_alternative<ApiError>(parsed)) {
      ADD_FAILURE() << body.substr(0, 200) << " was accepted";
      return {};
    }
    return std::get<ApiError>(std::move(parsed));
  }

  static inline Tokenizer* adder_ = nullptr;
  static inline Tokenizer* llama_ = nullptr;
};

TEST_F(ServerRequest, CompletionPromptIsEncodedAsGenerateDoes) {
  const std::string text = "What is 482 + 39?";
  const ApiRequest request =
      accept(Endpoint::kCompletions, R"({"model": "m", "prompt": "What is 482 + 39?"})", llama());
  EXPECT_EQ(request.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(request.model, "m");
  // `kvvm generate --prompt` adds the special tokens: llama-tiny's BOS leads.
  EXPECT_EQ(request.engine.prompt, llama_->encode(text, /*add_special_tokens=*/true));
  EXPECT_NE(request.engine.prompt, llama_->encode(text, /*add_special_tokens=*/false));
  EXPECT_EQ(
      accept(Endpoint::kCompletions, R"({"model": "m", "prompt": "What is 482 + 39?"})", adder())
          .engine.prompt,
      adder_->encode(text, true));
}

TEST_F(ServerRequest, ChatIsRenderedByTheTemplateAndEncodedWithoutSpecialTokens) {
  const std::string body = R"({"model": "m", "messages": [
      {"role": "system", "content": "You add."},
      {"role": "user", "content": "What is 482 + 39?"}]})";
  const std::vector<ChatMessage> messages = {{"system", "You add."}, {"user", "What is 482 + 39?"}};
  for (const auto& [ctx, tok] : {std::pair{adder(), adder_}, std::pair{llama(), llama_}}) {
    Result<std::string> text = tokenizer::render_chat(*ctx.chat_template, messages);
    ASSERT_TRUE(text.ok());
    const ApiRequest request = accept(Endpoint::kChat, body, ctx);
    EXPECT_EQ(request.endpoint, Endpoint::kChat);
    // `kvvm generate --chat --system`: the template spells its tokens, none is added.
    EXPECT_EQ(request.engine.prompt, tok->encode(*text, /*add_special_tokens=*/false));
  }
  // Llama-3's template begins with the BOS: encoding with special tokens would double it.
  Result<std::string> text = tokenizer::render_chat(ChatTemplate::kLlama3, messages);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(accept(Endpoint::kChat, body, llama()).engine.prompt, llama_->encode(*text, true));
}

TEST_F(ServerRequest, ChatContentPartsEqualTheirJoinedString) {
  const ApiRequest parts = accept(Endpoint::kChat, R"({"model": "m", "messages": [{"role": "user",
      "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "1 + 2?"}]}]})",
                                  adder());
  const ApiRequest plain = accept(
      Endpoint::kChat,
      R"({"model": "m", "messages": [{"role": "user", "content": "What is 1 + 2?"}]})", adder());
  EXPECT_FALSE(parts.engine.prompt.empty());
  EXPECT_EQ(parts.engine.prompt, plain.engine.prompt);
}

TEST_F(ServerRequest, TokenIdPromptIsTakenAsIs) {
  const ApiRequest request =
      accept(Endpoint::kCompletions, R"({"model": "m", "prompt": [5, 0, 7.0, 12]})", adder());
  EXPECT_EQ(request.engine.prompt, (std::vector<std::int32_t>{5, 0, 7, 12}));
}

TEST_F(ServerRequest, DefaultsFollowTheContract) {
  const ApiRequest request =
      accept(Endpoint::kCompletions, R"({"model": "m", "prompt": [1, 2, 3]})", adder());
  EXPECT_EQ(request.engine.max_tokens, kDefaultMaxTokens);
  EXPECT_EQ(request.engine.sampling.temperature, 0);
  EXPECT_EQ(request.engine.sampling.top_p, 1);
  EXPECT_EQ(request.engine.sampling.top_k, 0u);
  EXPECT_EQ(request.engine.sampling.seed, 0u);
  EXPECT_TRUE(request.engine.stop_strings.empty());
  EXPECT_TRUE(request.engine.use_model_eos);
  EXPECT_EQ(request.engine.tenant, 0u);
  EXPECT_FALSE(request.stream);
  EXPECT_FALSE(request.include_usage);  // as OpenAI: only when stream_options asks
  EXPECT_EQ(request.user, "");
  EXPECT_TRUE(request.ignored.empty());

  // Near the context's end the default shrinks to what is left.
  std::string ids = "[1";
  for (std::uint32_t i = 1; i < kContext - 5; ++i) ids += ", 1";
  ids += "]";
  EXPECT_EQ(accept(Endpoint::kCompletions, R"({"model": "m", "prompt": )" + ids + "}", adder())
                .engine.max_tokens,
            5u);
}

TEST_F(ServerRequest, ReadsEveryField) {
  const ApiRequest request = accept(Endpoint::kCompletions, R"({"model": "m", "prompt": "hi",
      "max_tokens": 7, "temperature": 1, "top_p": 0.5, "top_k": 5, "seed": 42,
      "stop": ["a", "bc"], "stream": true, "stream_options": {"include_usage": true},
      "user": "alice"})",
                                    adder());
  EXPECT_EQ(request.engine.max_tokens, 7u);
  EXPECT_EQ(request.engine.sampling.temperature, 1.0f);
  EXPECT_EQ(request.engine.sampling.top_p, 0.5f);
  EXPECT_EQ(request.engine.sampling.top_k, 5u);
  EXPECT_EQ(request.engine.sampling.seed, 42u);
  EXPECT_EQ(request.engine.stop_strings, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(request.stream);
  EXPECT_TRUE(request.include_usage);
  EXPECT_EQ(request.user, "alice");
  EXPECT_TRUE(request.engine.use_model_eos);

  const std::string head = R"({"model": "m", "prompt": "hi", )";
  const auto read = [&](const std::string& fields) {
    return accept(Endpoint::kCompletions, head + fields + "}", adder()).engine;
  };
  EXPECT_EQ(read(R"("temperature": 1.0)").sampling.temperature, 1.0f);
  EXPECT_EQ(read(R"("temperature": 0)").sampling.temperature, 0.0f);  // greedy
  EXPECT_EQ(read(R"("top_k": -1)").sampling.top_k, 0u);
  EXPECT_EQ(read(R"("top_k": 0)").sampling.top_k, 0u);
  EXPECT_EQ(read(R"("stop": "x")").stop_strings, (std::vector<std::string>{"x"}));
  EXPECT_EQ(read(R"("seed": -1)").sampling.seed, std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(read(R"("seed": 18446744073709551615)").sampling.seed,
            std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(read(R"("seed": -9223372036854775808)").sampling.seed, std::uint64_t{1} << 63);
  EXPECT_EQ(read(R"("max_tokens": 16.0)").max_tokens, 16u);
  const engine::EngineRequest penalised =
      read(R"("presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.3, )"
           R"("min_tokens": 2, "logit_bias": {"5": 100, "7": -100.0}, "max_tokens": 4)");
  EXPECT_EQ(penalised.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(penalised.sampling.frequency_penalty, -1.0f);
  EXPECT_EQ(penalised.sampling.repetition_penalty, 1.3f);
  EXPECT_EQ(penalised.min_tokens, 2u);
  EXPECT_EQ(penalised.logit_bias,
            (std::vector<std::pair<std::int32_t, float>>{{5, 100.0f}, {7, -100.0f}}));

  const ApiRequest chat = accept(Endpoint::kChat, R"({"model": "m", "max_completion_tokens": 3,
      "messages": [{"role": "user", "content": "hi"}]})",
                                 adder());
  EXPECT_EQ(chat.engine.max_tokens, 3u);
}

// vLLM's extension: generation goes on past the model's end token, to max_tokens.
TEST_F(ServerRequest, IgnoreEosLetsGenerationPassTheEndToken) {
  const std::string completion = R"({"model": "m", "prompt": "hi", )";
  const std::string chat = R"({"model": "m", "messages": [{"role": "user", "content": "a"}], )";
  for (const auto& [endpoint, head] :
       {std::pair{Endpoint::kCompletions, completion}, std::pair{Endpoint::kChat, chat}}) {
    EXPECT_FALSE(accept(endpoint, head + R"("ignore_eos": true})", adder()).engine.use_model_eos);
    EXPECT_TRUE(accept(endpoint, head + R"("ignore_eos": false})", adder()).engine.use_model_eos);
    EXPECT_TRUE(accept(endpoint, head + R"("ignore_eos": null})", adder()).engine.use_model_eos);
    const ApiRequest request = accept(endpoint, head + R"("ignore_eos": true})", adder());
    EXPECT_TRUE(request.ignored.empty());
    EXPECT_TRUE(request.engine.stop_ids.empty());  // nothing but max_tokens and stop strings
    const ApiError error = refuse(endpoint, head + R"("ignore_eos": "yes"})", adder());
    EXPECT_EQ(error.param, "ignore_eos");
    EXPECT_EQ(error.message, R"(ignore_eos: must be true or false, not string "yes")");
  }
}

TEST_F(ServerRequest, NeutralValuesOfUnsupportedFieldsAreAccepted) {
  const std::string completion_head = R"({"model": "m", "prompt": "hi", )";
  for (const char* fields :
       {R"("n": 1)", R"("n": null)", R"("logprobs": false)", R"("logprobs": null)",
        R"("presence_penalty": 0)", R"("frequency_penalty": 0.0)", R"("logit_bias": {})",
        R"("best_of": 1)", R"("echo": false)", R"("suffix": null)", R"("suffix": "")",
        R"("stream_options": {"include_usage": false})", R"("user": null)",
        R"("repetition_penalty": 1)", R"("min_tokens": 0)", R"("store": true)",
        R"("metadata": {"team": "a"})", R"("response_format": {"type": "text"})"}) {
    SCOPED_TRACE(fields);
    accept(Endpoint::kCompletions, completion_head + fields + "}", adder());
  }
  const std::string chat_head =
      R"({"model": "m", "messages": [{"role": "user", "content": "a"}], )";
  for (const char* fields :
       {R"("n": 1)", R"("logprobs": false)", R"("top_logprobs": 0)", R"("tools": [])",
        R"("tool_choice": "none")", R"("presence_penalty": 0)", R"("stream": false)",
        R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none")",
        R"("parallel_tool_calls": false)", R"("modalities": ["text"])",
        R"("tool_choice": "auto")"}) {  // a choice among no tools calls nothing
    SCOPED_TRACE(fields);
    accept(Endpoint::kChat, chat_head + fields + "}", adder());
  }
}

struct Refusal {
  Endpoint endpoint;
  std::string body;
  std::string param;    // "": null (the body itself is at fault)
  std::string mention;  // a part of the message: the bad value or the limit
};

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
      {kChat, ch + R"("tools": [{"type": "function"}]})", "tools", "tools"},
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
      {Endpoint::kCompletions, c + R"("response_format": {"type": "json_object"}})",
       "response_format", "json_object"},
      {Endpoint::kChat, ch + R"("tools": [{"type": "function"}]})", "tools", "auto"},
      {Endpoint::kChat, ch + R"("tools": [{"type": "function"}], "tool_choice": "required"})",
       "tools", "required"},
      {Endpoint::kChat, ch + R"("functions": [{"name": "f"}]})", "functions", "function_call"},
      {Endpoint::kChat, ch + R"("audio": {"voice": "alloy"}})", "audio", "text output only"},
      {Endpoint::kChat, ch + R"("modalities": ["text", "audio"]})", "modalities", "audio"},
      {Endpoint::kChat, R"({"model": "m", "messages": [{"role": "tool", "content": "a"}]})",
       "messages[0].role", "tool"},
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

// Fields of newer API versions and of other servers are ignored, as OpenAI's and vLLM's
// servers do, and reported so the server can log and count them.
TEST_F(ServerRequest, UnknownFieldsAreIgnoredAndReported) {
  const ApiRequest completion = accept(Endpoint::kCompletions, R"({"model": "m", "prompt": "hi",
      "temprature": 1, "messages": [], "stream_options": {"continuous_usage_stats": true},
      "stream": true})",
                                       adder());
  EXPECT_EQ(completion.ignored,
            (std::vector<std::string>{"messages", "stream_options.continuous_usage_stats",
                                      "temprature"}));
  // An ignored field changes nothing: the same request without it.
  EXPECT_EQ(
      completion.engine.prompt,
      accept(Endpoint::kCompletions, R"({"model": "m", "prompt": "hi"})", adder()).engine.prompt);
  EXPECT_EQ(completion.engine.sampling.temperature, 0.0f);

  const ApiRequest chat = accept(Endpoint::kChat, R"({"model": "m", "prompt": "x",
      "messages": [{"role": "user", "content": [{"type": "text", "text": "a",
      "cache_control": {}}], "name": "alice", "tool_calls": []}]})",
                                 adder());
  EXPECT_EQ(chat.ignored, (std::vector<std::string>{"prompt", "messages.tool_calls",
                                                    "messages.content.cache_control"}));
  EXPECT_EQ(chat.engine.prompt,
            accept(Endpoint::kChat, R"({"model": "m", "messages": [{"role": "user",
                "content": "a"}]})",
                   adder())
                .engine.prompt);
}

TEST_F(ServerRequest, DeveloperIsTheSystemRole) {
  const auto ids = [&](const char* role) {
    return accept(Endpoint::kChat,
                  std::string(R"({"model": "m", "messages": [{"role": ")") + role +
                      R"(", "content": "be brief"}, {"role": "user", "content": "1+2"}]})",
                  adder())
        .engine.prompt;
  };
  EXPECT_EQ(ids("developer"), ids("system"));
  EXPECT_NE(ids("developer"), ids("user"));
}

TEST_F(ServerRequest, APromptListOfOneIsThatPrompt) {
  const auto ids = [&](const std::string& prompt) {
    return accept(Endpoint::kCompletions, R"({"model": "m", "prompt": )" + prompt + "}", adder())
        .engine.prompt;
  };
  EXPECT_EQ(ids(R"(["one two"])"), ids(R"("one two")"));
  EXPECT_EQ(ids("[[5, 0, 7]]"), ids("[5, 0, 7]"));
  EXPECT_EQ(ids("[[5, 0, 7]]"), (std::vector<std::int32_t>{5, 0, 7}));
}

TEST_F(ServerRequest, APromptListIsEveryPromptInOrder) {
  const ApiRequest list =
      accept(Endpoint::kCompletions,
             R"({"model": "m", "prompt": [[5, 0], [7], [1, 2, 3]], "n": 2})", adder());
  EXPECT_EQ(list.engine.prompt, (std::vector<std::int32_t>{5, 0}));
  ASSERT_EQ(list.more_prompts.size(), 2u);
  EXPECT_EQ(list.more_prompts[0], (std::vector<std::int32_t>{7}));
  EXPECT_EQ(list.more_prompts[1], (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_EQ(list.engine.n, 2u);
  const ApiRequest texts =
      accept(Endpoint::kCompletions, R"({"model": "m", "prompt": ["one", "two"]})", adder());
  EXPECT_EQ(texts.more_prompts.size(), 1u);
  // Past the bound: refused, naming it.
  std::string many = R"({"model": "m", "prompt": [)";
  for (int i = 0; i < 129; ++i) many += std::string(i == 0 ? "" : ", ") + "[1]";
  const ApiError error = refuse(Endpoint::kCompletions, many + "]}", adder());
  EXPECT_EQ(error.param, "prompt");
  EXPECT_TRUE(contains(error.message, "at most 128")) << error.message;
}

TEST_F(ServerRequest, ChoicesAndLogprobsAreRead) {
  const ApiRequest completion =
      accept(Endpoint::kCompletions,
             R"({"model": "m", "prompt": "hi", "n": 3, "best_of": 3, "logprobs": 4, "echo": true})",
             adder());
  EXPECT_EQ(completion.engine.n, 3u);
  EXPECT_EQ(completion.engine.logprobs, 4u);
  EXPECT_TRUE(completion.echo);
  EXPECT_TRUE(completion.engine.prompt_logprobs);  // echo with logprobs scores the prompt
  // Echo without logprobs echoes the text only; with max_tokens 0 the prompt is the answer.
  const ApiRequest echo_only =
      accept(Endpoint::kCompletions, R"({"model": "m", "prompt": "hi", "echo": true})", adder());
  EXPECT_FALSE(echo_only.engine.prompt_logprobs);
  EXPECT_FALSE(echo_only.engine.logprobs.has_value());
  const ApiRequest scoring = accept(
      Endpoint::kCompletions,
      R"({"model": "m", "prompt": "hi", "echo": true, "logprobs": 1, "max_tokens": 0})", adder());
  EXPECT_EQ(scoring.engine.max_tokens, 0u);
  EXPECT_TRUE(scoring.engine.prompt_logprobs);
  const ApiRequest chat = accept(Endpoint::kChat,
                                 R"({"model": "m", "messages": [{"role": "user", "content": "a"}],
                                     "logprobs": true, "top_logprobs": 2, "n": 2})",
                                 adder());
  EXPECT_EQ(chat.engine.logprobs, 2u);
  EXPECT_EQ(chat.engine.n, 2u);
  EXPECT_FALSE(chat.engine.prompt_logprobs);
  const ApiRequest plain =
      accept(Endpoint::kChat,
             R"({"model": "m", "messages": [{"role": "user", "content": "a"}], "logprobs": true})",
             adder());
  EXPECT_EQ(plain.engine.logprobs, 0u);
}

// /tokenize gives the ids the completion and chat endpoints would compute, as vLLM's does.
TEST_F(ServerRequest, TokenizeGivesTheIdsTheGenerationEndpointsSee) {
  const auto tokens = [](std::variant<TokenizeRequest, ApiError> parsed) {
    if (const ApiError* error = std::get_if<ApiError>(&parsed)) {
      ADD_FAILURE() << error->message;
      return std::vector<std::int32_t>{};
    }
    return std::get<TokenizeRequest>(parsed).tokens;
  };
  EXPECT_EQ(tokens(parse_tokenize(R"({"prompt": "one two"})", llama())),
            accept(Endpoint::kCompletions, R"({"model": "m", "prompt": "one two"})", llama())
                .engine.prompt);
  const std::string messages = R"("messages": [{"role": "user", "content": "1+2"}])";
  EXPECT_EQ(tokens(parse_tokenize(R"({"model": "m", )" + messages + "}", adder())),
            accept(Endpoint::kChat, R"({"model": "m", )" + messages + "}", adder()).engine.prompt);
  // Without the generation prompt the chat ends before the assistant's header.
  EXPECT_LT(tokens(parse_tokenize(R"({"add_generation_prompt": false, )" + messages + "}", adder()))
                .size(),
            tokens(parse_tokenize("{" + messages + "}", adder())).size());
  // llama-tiny's tokenizer adds a BOS unless told not to.
  EXPECT_EQ(
      tokens(parse_tokenize(R"({"prompt": "one"})", llama())).size(),
      tokens(parse_tokenize(R"({"prompt": "one", "add_special_tokens": false})", llama())).size() +
          1);
  std::variant<TokenizeRequest, ApiError> lenient =
      parse_tokenize(R"({"prompt": "one", "return_token_strs": true})", llama());
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(lenient));
  EXPECT_EQ(std::get<TokenizeRequest>(lenient).ignored,
            (std::vector<std::string>{"return_token_strs"}));

  const std::vector<Refusal> refusals = {
      {Endpoint::kCompletions, R"({"prompt": "a", )" + messages + "}", "messages", "exactly one"},
      {Endpoint::kCompletions, R"({})", "prompt", "exactly one"},
      {Endpoint::kCompletions, R"({"prompt": [1, 2]})", "prompt", "array"},
      {Endpoint::kCompletions, R"({"prompt": "a", "add_special_tokens": "yes"})",
       "add_special_tokens", "string"},
      {Endpoint::kCompletions, R"({"add_special_tokens": true, )" + messages + "}",
       "add_special_tokens", "not supported"},
      {Endpoint::kCompletions, R"({"model": 3, "prompt": "a"})", "model", "string"},
  };
  for (const Refusal& refusal : refusals) {
    SCOPED_TRACE(refusal.body);
    std::variant<TokenizeRequest, ApiError> parsed = parse_tokenize(refusal.body, adder());
    ASSERT_TRUE(std::holds_alternative<ApiError>(parsed));
    const ApiError& error = std::get<ApiError>(parsed);
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, refusal.param);
    EXPECT_TRUE(contains(error.message, refusal.mention)) << error.message;
  }
  std::variant<TokenizeRequest, ApiError> other =
      parse_tokenize(R"({"model": "other", "prompt": "a"})", adder());
  ASSERT_TRUE(std::holds_alternative<ApiError>(other));
  EXPECT_EQ(std::get<ApiError>(other).status, 404);
}

TEST_F(ServerRequest, DetokenizeTakesVocabularyIdsOnly) {
  std::variant<DetokenizeRequest, ApiError> parsed =
      parse_detokenize(R"({"tokens": [5, 0, 7.0]})", adder());
  ASSERT_TRUE(std::holds_alternative<DetokenizeRequest>(parsed));
  EXPECT_EQ(std::get<DetokenizeRequest>(parsed).tokens, (std::vector<std::int32_t>{5, 0, 7}));
  const std::string past = std::to_string(adder_->vocab_size());
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({})", "tokens"},
           {R"({"tokens": "1 2"})", "tokens"},
           {R"({"tokens": [1, -1]})", "tokens[1]"},
           {R"({"tokens": [)" + past + "]}", "tokens[0]"},
           {R"({"tokens": [1.5]})", "tokens[0]"}}) {
    SCOPED_TRACE(body);
    std::variant<DetokenizeRequest, ApiError> refused = parse_detokenize(body, adder());
    ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
    EXPECT_EQ(std::get<ApiError>(refused).param, param);
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
  ctx.chat_template.reset();
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
}  // namespace kvvm::server
