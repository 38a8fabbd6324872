// The OpenAI request bodies' fields: every field read with its range checked, the defaults the
// contract gives, neutral values of unsupported fields accepted, and unknown fields ignored and
// reported.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "server_request_fixture.h"

namespace kvvm::server::request_test {
namespace {

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

  EXPECT_EQ(read(R"("min_p": 0.05)").sampling.min_p, 0.05f);
  EXPECT_EQ(read(R"("top_p": 1)").sampling.min_p, 0.0f);
  // DRY as llama.cpp's server takes it; its breakers become the ids of the tokens holding them.
  EXPECT_EQ(read(R"("top_p": 1)").dry.multiplier, 0.0f);
  const engine::EngineRequest dry =
      read(R"("dry_multiplier": 0.8, "dry_base": 2, "dry_allowed_length": 3, )"
           R"("dry_penalty_last_n": 64, "dry_sequence_breakers": ["1"])");
  EXPECT_EQ(dry.dry.multiplier, 0.8f);
  EXPECT_EQ(dry.dry.base, 2.0f);
  EXPECT_EQ(dry.dry.allowed_length, 3u);
  EXPECT_EQ(dry.dry.last_n, 64u);
  ASSERT_FALSE(dry.dry.breakers.empty());
  EXPECT_TRUE(std::is_sorted(dry.dry.breakers.begin(), dry.dry.breakers.end()));
  for (const std::int32_t id : dry.dry.breakers) {
    const std::string text = adder_->decode(std::vector<std::int32_t>{id});
    EXPECT_NE(text.find('1'), std::string::npos) << id << " " << text;
  }
  const engine::EngineRequest defaults = read(R"("dry_multiplier": 1)");
  EXPECT_EQ(defaults.dry.base, 1.75f);
  EXPECT_EQ(defaults.dry.allowed_length, 2u);
  EXPECT_EQ(defaults.dry.last_n, 0u);  // -1: the whole context
  EXPECT_FALSE(defaults.dry.breakers.empty());
  EXPECT_EQ(read(R"("dry_multiplier": 1, "dry_penalty_last_n": 0)").dry.multiplier, 0.0f);

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

}  // namespace
}  // namespace kvvm::server::request_test
