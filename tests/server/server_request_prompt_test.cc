// The OpenAI request bodies' prompts become the ids `kvvm generate` would use: a completion's
// text, token ids or list of prompts; a chat rendered by the template; /tokenize and
// /detokenize as the generation endpoints see them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "server_request_fixture.h"

namespace kvvm::server::request_test {
namespace {

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
  for (const auto& [ctx, tok, kind] : {std::tuple{adder(), adder_, ChatTemplate::kChatML},
                                       std::tuple{llama(), llama_, ChatTemplate::kLlama3}}) {
    Result<std::string> text = tokenizer::render_chat(kind, messages);
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

// Text parts reach the template as one string, joined with "\n" as vLLM joins them.
TEST_F(ServerRequest, ChatContentPartsEqualTheirJoinedString) {
  const ApiRequest parts = accept(Endpoint::kChat, R"({"model": "m", "messages": [{"role": "user",
      "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "1 + 2?"}]}]})",
                                  adder());
  const ApiRequest plain = accept(
      Endpoint::kChat,
      R"({"model": "m", "messages": [{"role": "user", "content": "What is\n1 + 2?"}]})", adder());
  EXPECT_FALSE(parts.engine.prompt.empty());
  EXPECT_EQ(parts.engine.prompt, plain.engine.prompt);
}

TEST_F(ServerRequest, TokenIdPromptIsTakenAsIs) {
  const ApiRequest request =
      accept(Endpoint::kCompletions, R"({"model": "m", "prompt": [5, 0, 7.0, 12]})", adder());
  EXPECT_EQ(request.engine.prompt, (std::vector<std::int32_t>{5, 0, 7, 12}));
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

}  // namespace
}  // namespace kvvm::server::request_test
