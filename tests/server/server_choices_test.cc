// n choices, prompt lists, log-probabilities and echo through the HTTP endpoints on the CPU:
// choice i of n is the answer of n = 1 with seed + i, lists are ordered by prompt then n,
// streamed choices interleave under their index, and log-probabilities come in OpenAI's shapes.
#include <gtest/gtest.h>
#include <httplib.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/server_rig.h"
#include "support/test_data.h"

namespace kvvm::server::choices_test {
namespace {

using nlohmann::json;
using testing::post_json;
using testing::sse_events;

using ServerChoices = testing::LlamaTinyServerTest;

json choice_body_of(const httplib::Result& result) {
  if (!result) return nullptr;
  return json::parse(result->body, nullptr, /*allow_exceptions=*/false);
}

json post_completion(httplib::Client& client, const std::string& fields) {
  auto result = post_json(client, "/v1/completions", R"({"model": "llama-tiny", )" + fields + "}");
  EXPECT_TRUE(result);
  if (!result) return nullptr;
  EXPECT_EQ(result->status, 200) << result->body;
  return choice_body_of(result);
}

TEST_F(ServerChoices, ChoiceIIsTheAnswerOfOneChoiceWithSeedPlusI) {
  auto client = rig_->client();
  const std::string request =
      R"("prompt": "one two three", "max_tokens": 8, "temperature": 1.0, "n": 3, "seed": 40)";
  const json all = post_completion(client, request);
  ASSERT_EQ(all["choices"].size(), 3u) << all.dump();
  std::uint64_t completion_tokens = 0;
  for (int i = 0; i < 3; ++i) {
    const json& choice = all["choices"][i];
    EXPECT_EQ(choice["index"], i);
    const json one = post_completion(client, R"("prompt": "one two three", "max_tokens": 8, )"
                                             R"("temperature": 1.0, "seed": )" +
                                                 std::to_string(40 + i));
    EXPECT_EQ(choice["text"].get<std::string>(), one["choices"][0]["text"].get<std::string>())
        << "choice " << i;
    EXPECT_EQ(choice["finish_reason"].get<std::string>(),
              one["choices"][0]["finish_reason"].get<std::string>());
    completion_tokens += one["usage"]["completion_tokens"].get<std::uint64_t>();
    if (i == 0) {
      EXPECT_EQ(all["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
    }
  }
  EXPECT_NE(all["choices"][0]["text"].get<std::string>(),
            all["choices"][1]["text"].get<std::string>());
  // The prompt counted once, every choice's tokens.
  EXPECT_EQ(all["usage"]["completion_tokens"], completion_tokens);
}

TEST_F(ServerChoices, StreamedChoicesInterleaveUnderTheirIndex) {
  auto client = rig_->client();
  const std::string fields =
      R"("prompt": "Number 41 is followed by", "max_tokens": 10, "temperature": 0.8, "seed": 3, )"
      R"("n": 3)";
  const json whole = post_completion(client, fields);
  ASSERT_EQ(whole["choices"].size(), 3u);
  auto streamed = post_json(client, "/v1/completions",
                            R"({"model": "llama-tiny", )" + fields + R"(, "stream": true})");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  bool done = false;
  const std::vector<json> events = sse_events(streamed->body, &done);
  EXPECT_TRUE(done);
  std::map<int, std::string> texts;
  std::map<int, int> finishes;
  for (const json& event : events) {
    ASSERT_EQ(event["choices"].size(), 1u) << event.dump();
    const json& choice = event["choices"][0];
    const int index = choice["index"].get<int>();
    ASSERT_GE(index, 0);
    ASSERT_LT(index, 3);
    EXPECT_EQ(finishes[index], 0) << "a chunk after choice " << index << " finished";
    texts[index] += choice["text"].get<std::string>();
    if (!choice["finish_reason"].is_null()) ++finishes[index];
    EXPECT_FALSE(event.contains("usage"));  // not asked for
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(texts[i], whole["choices"][i]["text"].get<std::string>()) << "choice " << i;
    EXPECT_EQ(finishes[i], 1) << "choice " << i;
  }
}

TEST_F(ServerChoices, APromptListIsAnsweredByPromptThenByN) {
  auto client = rig_->client();
  const json listed = post_completion(
      client, R"("prompt": ["alpha beta", "gamma delta"], "n": 2, "max_tokens": 6, )"
              R"("temperature": 1.0, "seed": 11)");
  ASSERT_EQ(listed["choices"].size(), 4u) << listed.dump();
  std::uint64_t prompt_tokens = 0;
  for (int p = 0; p < 2; ++p) {
    const std::string prompt = p == 0 ? "alpha beta" : "gamma delta";
    const json alone =
        post_completion(client, R"("prompt": ")" + prompt +
                                    R"(", "n": 2, "max_tokens": 6, "temperature": 1.0, )"
                                    R"("seed": 11)");
    prompt_tokens += alone["usage"]["prompt_tokens"].get<std::uint64_t>();
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(listed["choices"][2 * p + i]["index"], 2 * p + i);
      EXPECT_EQ(listed["choices"][2 * p + i]["text"].get<std::string>(),
                alone["choices"][i]["text"].get<std::string>())
          << "prompt " << p << ", choice " << i;
    }
  }
  EXPECT_EQ(listed["usage"]["prompt_tokens"], prompt_tokens);
}

TEST_F(ServerChoices, CompletionLogprobsListEveryTokenWithItsAlternatives) {
  auto client = rig_->client();
  const json body = post_completion(client, R"("prompt": "The quick brown fox", "max_tokens": 6, )"
                                            R"("logprobs": 3)");
  const json& logprobs = body["choices"][0]["logprobs"];
  ASSERT_TRUE(logprobs.is_object()) << body.dump();
  const std::size_t n = body["usage"]["completion_tokens"].get<std::size_t>();
  ASSERT_EQ(logprobs["tokens"].size(), n);
  ASSERT_EQ(logprobs["token_logprobs"].size(), n);
  ASSERT_EQ(logprobs["top_logprobs"].size(), n);
  ASSERT_EQ(logprobs["text_offset"].size(), n);
  std::string joined;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(logprobs["text_offset"][i], joined.size());
    joined += logprobs["tokens"][i].get<std::string>();
    const double logprob = logprobs["token_logprobs"][i].get<double>();
    EXPECT_LE(logprob, 0.0);
    const json& top = logprobs["top_logprobs"][i];
    EXPECT_LE(top.size(), 3u);
    EXPECT_GE(top.size(), 1u);
    // Greedy: the token is the most likely, so its log-probability is the highest listed.
    for (const auto& [token, value] : top.items()) EXPECT_LE(value.get<double>(), logprob + 1e-6);
  }
  EXPECT_EQ(joined, body["choices"][0]["text"].get<std::string>());
  // Not asked: null, as OpenAI writes it.
  const json plain = post_completion(client, R"("prompt": "The quick brown fox", "max_tokens": 2)");
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
}

TEST_F(ServerChoices, EchoWithNoTokensScoresThePrompt) {
  auto client = rig_->client();
  const json body = post_completion(
      client, R"("prompt": "The quick brown fox", "max_tokens": 0, "echo": true, "logprobs": 1)");
  const json& choice = body["choices"][0];
  const std::size_t prompt_tokens = body["usage"]["prompt_tokens"].get<std::size_t>();
  EXPECT_EQ(body["usage"]["completion_tokens"], 0);
  EXPECT_EQ(choice["finish_reason"], "length");
  const json& logprobs = choice["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), prompt_tokens) << body.dump();
  // The first token has nothing before it: null, as OpenAI's echo reports it.
  EXPECT_TRUE(logprobs["token_logprobs"][0].is_null());
  EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
  std::string joined;
  for (std::size_t i = 0; i < prompt_tokens; ++i) {
    joined += logprobs["tokens"][i].get<std::string>();
    if (i > 0) {
      EXPECT_LE(logprobs["token_logprobs"][i].get<double>(), 0.0);
      EXPECT_EQ(logprobs["top_logprobs"][i].size(), 1u);
    }
  }
  EXPECT_EQ(choice["text"].get<std::string>(), joined);
  EXPECT_NE(choice["text"].get<std::string>().find("The quick brown fox"), std::string::npos);
  // With tokens to generate, the echoed prompt leads the text and the log-probabilities.
  const json more = post_completion(
      client, R"("prompt": "The quick brown fox", "max_tokens": 3, "echo": true, "logprobs": 0)");
  const json generated =
      post_completion(client, R"("prompt": "The quick brown fox", "max_tokens": 3)");
  EXPECT_EQ(more["choices"][0]["text"].get<std::string>(),
            choice["text"].get<std::string>() + generated["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(more["choices"][0]["logprobs"]["tokens"].size(),
            prompt_tokens + generated["usage"]["completion_tokens"].get<std::size_t>());
  EXPECT_EQ(more["choices"][0]["logprobs"]["token_logprobs"][1], logprobs["token_logprobs"][1]);
}

TEST_F(ServerChoices, StreamedEchoLeadsEachChoiceWithItsPromptAndItsScores) {
  auto client = rig_->client();
  const std::string fields =
      R"("prompt": ["The quick brown fox", "one two three"], "n": 2, "max_tokens": 3, )"
      R"("echo": true, "logprobs": 1)";
  const json whole = post_completion(client, fields);
  ASSERT_EQ(whole["choices"].size(), 4u);
  auto streamed = post_json(client, "/v1/completions",
                            R"({"model": "llama-tiny", )" + fields + R"(, "stream": true})");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  std::map<int, std::string> texts;
  std::map<int, std::vector<json>> logprobs;
  for (const json& event : sse_events(streamed->body)) {
    const json& choice = event["choices"][0];
    const int index = choice["index"].get<int>();
    texts[index] += choice["text"].get<std::string>();
    if (choice["logprobs"].is_object()) {
      for (const json& v : choice["logprobs"]["token_logprobs"]) logprobs[index].push_back(v);
    }
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(texts[i], whole["choices"][i]["text"].get<std::string>()) << "choice " << i;
    const json& want = whole["choices"][i]["logprobs"]["token_logprobs"];
    ASSERT_EQ(logprobs[i].size(), want.size()) << "choice " << i;
    EXPECT_TRUE(logprobs[i][0].is_null()) << "choice " << i;  // the first prompt token
    for (std::size_t j = 1; j < want.size(); ++j) {
      EXPECT_NEAR(logprobs[i][j].get<double>(), want[j].get<double>(), 1e-6)
          << "choice " << i << ", token " << j;
    }
  }
}

TEST_F(ServerChoices, TooManyChoicesAre400) {
  auto client = rig_->client();
  auto result =
      post_json(client, "/v1/completions", R"({"model": "llama-tiny", "prompt": "a", "n": 17})");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 400);
  EXPECT_EQ(choice_body_of(result)["error"]["param"], "n");
}

TEST(ServerChoicesChat, ChatLogprobsCarryTokensBytesAndAlternatives) {
  ServerOptions options;
  options.model_name = "kvvm-adder";
  options.chat_renderer = tokenizer::ChatRenderer::builtin(tokenizer::ChatTemplate::kChatML);
  auto rig = testing::ServerRig::make(test::demo_model_dir(), options);
  ASSERT_NE(rig, nullptr);
  auto client = rig->client();
  auto result = post_json(client, "/v1/chat/completions",
                          R"({"model": "kvvm-adder", "messages": [{"role": "user", )"
                          R"("content": "What is 482 + 39?"}], "max_tokens": 6, )"
                          R"("logprobs": true, "top_logprobs": 2, "n": 2})");
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200) << result->body;
  const json body = choice_body_of(result);
  ASSERT_EQ(body["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const json& choice = body["choices"][i];
    EXPECT_EQ(choice["index"], i);
    const json& content = choice["logprobs"]["content"];
    ASSERT_TRUE(content.is_array()) << body.dump();
    ASSERT_EQ(content.size(), body["usage"]["completion_tokens"].get<std::size_t>() / 2);
    std::string joined;
    for (const json& entry : content) {
      joined += entry["token"].get<std::string>();
      EXPECT_EQ(entry["bytes"].size(), entry["token"].get<std::string>().size());
      EXPECT_EQ(entry["top_logprobs"].size(), 2u);
      EXPECT_NEAR(entry["top_logprobs"][0]["logprob"].get<double>(), entry["logprob"].get<double>(),
                  1e-6);  // greedy: the most likely
    }
    EXPECT_EQ(joined, choice["message"]["content"].get<std::string>());
    EXPECT_EQ(choice["message"]["content"].get<std::string>(),
              body["choices"][0]["message"]["content"].get<std::string>());
  }
}

}  // namespace
}  // namespace kvvm::server::choices_test
