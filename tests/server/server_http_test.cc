// The server's endpoints end to end over loopback HTTP, on fixture checkpoints on the CPU: the
// answers equal `kvvm generate`'s for the same prompt and sampling, streamed or not.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "commands/generate_command.h"
#include "server/metrics.h"
#include "support/prometheus_text.h"
#include "support/server_rig.h"
#include "support/test_data.h"

namespace kvvm::server {
namespace {

using testing::post_json;
using testing::ServerRig;
using testing::sse_events;

// `kvvm generate --json` in-process: the reference answer.
nlohmann::json generate_json(cli::GenerateOptions options) {
  options.backend = "cpu";
  options.json = true;
  std::ostringstream out, err;
  const int code = cli::run_generate(options, out, err);
  EXPECT_EQ(code, 0) << err.str();
  return nlohmann::json::parse(out.str(), nullptr, /*allow_exceptions=*/false);
}

nlohmann::json body_of(const httplib::Result& result) {
  if (!result) return nullptr;
  return nlohmann::json::parse(result->body, nullptr, /*allow_exceptions=*/false);
}

using ServerHttpTest = testing::LlamaTinyServerTest;

TEST_F(ServerHttpTest, CompletionEqualsGenerate) {
  cli::GenerateOptions options;
  options.model_dir = test::model_fixture_dir("llama-tiny");
  options.prompt = "The quick brown fox";
  options.max_tokens = 12;
  const nlohmann::json expected = generate_json(options);
  ASSERT_TRUE(expected.is_object());

  auto client = rig_->client();
  auto result = post_json(client, "/v1/completions",
                          R"({"model": "llama-tiny", "prompt": "The quick brown fox", )"
                          R"("max_tokens": 12})");
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(result->get_header_value("Content-Type"), "application/json");
  const nlohmann::json body = body_of(result);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "llama-tiny");
  EXPECT_EQ(body["choices"][0]["text"], expected["text"]);
  EXPECT_EQ(body["choices"][0]["finish_reason"], expected["finish_reason"]);
  EXPECT_EQ(body["usage"]["prompt_tokens"], expected["prompt_ids"].size());
  EXPECT_EQ(body["usage"]["completion_tokens"], expected["token_ids"].size());
  EXPECT_EQ(body["usage"]["total_tokens"],
            expected["prompt_ids"].size() + expected["token_ids"].size());
}

TEST_F(ServerHttpTest, SampledCompletionEqualsGenerateWithTheSameSeed) {
  cli::GenerateOptions options;
  options.model_dir = test::model_fixture_dir("llama-tiny");
  options.prompt = "one two three";
  options.max_tokens = 10;
  options.temperature = 0.9;
  options.top_p = 0.95;
  options.seed = 7;
  const nlohmann::json expected = generate_json(options);

  auto client = rig_->client();
  auto result = post_json(client, "/v1/completions",
                          R"({"model": "llama-tiny", "prompt": "one two three", "max_tokens": 10,)"
                          R"( "temperature": 0.9, "top_p": 0.95, "seed": 7})");
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(body_of(result)["choices"][0]["text"], expected["text"]);
}

TEST_F(ServerHttpTest, StreamedChunksConcatenateToTheWholeAnswer) {
  auto client = rig_->client();
  const std::string request = R"({"model": "llama-tiny", "prompt": "Number 41 is followed by",)"
                              R"( "max_tokens": 14)";
  auto whole = post_json(client, "/v1/completions", request + "}");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const nlohmann::json expected = body_of(whole);

  auto streamed =
      post_json(client, "/v1/completions",
                request + R"(, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
  bool done = false;
  const std::vector<nlohmann::json> events = sse_events(streamed->body, &done);
  EXPECT_TRUE(done) << streamed->body;
  ASSERT_GE(events.size(), 3u) << streamed->body;
  EXPECT_EQ(streamed->body.substr(streamed->body.size() - 14), "data: [DONE]\n\n");
  std::string text;
  std::string finish;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    ASSERT_TRUE(events[i].is_object()) << streamed->body;
    EXPECT_EQ(events[i]["object"], "text_completion");
    EXPECT_EQ(events[i]["id"], events[0]["id"]);
    text += events[i]["choices"][0]["text"].get<std::string>();
    if (!events[i]["choices"][0]["finish_reason"].is_null()) {
      finish = events[i]["choices"][0]["finish_reason"].get<std::string>();
    }
  }
  EXPECT_EQ(text, expected["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(finish, expected["choices"][0]["finish_reason"].get<std::string>());
  // The usage chunk, asked for, comes last, before [DONE].
  const nlohmann::json& usage = events.back();
  EXPECT_TRUE(usage["choices"].empty()) << usage.dump();
  EXPECT_EQ(usage["usage"]["prompt_tokens"], expected["usage"]["prompt_tokens"]);
  EXPECT_EQ(usage["usage"]["completion_tokens"], expected["usage"]["completion_tokens"]);
  EXPECT_EQ(usage["usage"]["total_tokens"], expected["usage"]["total_tokens"]);
  // The same prompt a second time: its prefix came from the cache.
  EXPECT_EQ(expected["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_GT(usage["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
}

// As OpenAI streams: no usage chunk unless stream_options asks (a chunk with no choices breaks
// the common `chunk.choices[0]` loop), the role in the first chat chunk, the finish reason on
// the last chunk only, [DONE] last.
TEST_F(ServerHttpTest, StreamsCarryNoUsageChunkUnlessAskedAndFinishOnTheLastChunk) {
  auto client = rig_->client();
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/completions",
            R"({"model": "llama-tiny", "prompt": "one two", "max_tokens": 6, "stream": true})"},
           {"/v1/completions",
            R"({"model": "llama-tiny", "prompt": "one two", "max_tokens": 6, "stream": true,)"
            R"( "stream_options": {"include_usage": false}})"}}) {
    SCOPED_TRACE(body);
    auto streamed = post_json(client, path, body);
    ASSERT_TRUE(streamed);
    ASSERT_EQ(streamed->status, 200) << streamed->body;
    bool done = false;
    const std::vector<nlohmann::json> events = sse_events(streamed->body, &done);
    EXPECT_TRUE(done);
    ASSERT_FALSE(events.empty());
    for (std::size_t i = 0; i < events.size(); ++i) {
      ASSERT_EQ(events[i]["choices"].size(), 1u) << streamed->body;
      EXPECT_FALSE(events[i].contains("usage")) << streamed->body;
      const bool finishes = !events[i]["choices"][0]["finish_reason"].is_null();
      EXPECT_EQ(finishes, i + 1 == events.size()) << streamed->body;
    }
    EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
  }
}

TEST_F(ServerHttpTest, AModelIsRetrievedByIdAndAnUnknownOneIs404) {
  auto client = rig_->client();
  auto model = client.Get("/v1/models/llama-tiny");
  ASSERT_TRUE(model);
  ASSERT_EQ(model->status, 200) << model->body;
  auto list = client.Get("/v1/models");
  ASSERT_TRUE(list);
  EXPECT_EQ(body_of(model), body_of(list)["data"][0]);

  auto missing = client.Get("/v1/models/org/other-model");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404) << missing->body;
  const nlohmann::json error = body_of(missing)["error"];
  EXPECT_EQ(error["code"], "model_not_found");
  EXPECT_EQ(error["param"], "model");
  EXPECT_NE(error["message"].get<std::string>().find("'org/other-model'"), std::string::npos)
      << missing->body;

  // Every answer, an error's too, carries its own x-request-id (OpenAI's SDK reports it).
  const std::string ok_id = model->get_header_value("x-request-id");
  const std::string missing_id = missing->get_header_value("x-request-id");
  EXPECT_TRUE(ok_id.starts_with("req_") && ok_id.size() == 28) << ok_id;
  EXPECT_TRUE(missing_id.starts_with("req_") && missing_id.size() == 28) << missing_id;
  EXPECT_NE(ok_id, missing_id);
}

TEST_F(ServerHttpTest, TokenizeAndDetokenizeRoundTrip) {
  auto client = rig_->client();
  auto tokenized = post_json(client, "/tokenize",
                             R"({"model": "llama-tiny", "prompt": "one two three",)"
                             R"( "add_special_tokens": false})");
  ASSERT_TRUE(tokenized);
  ASSERT_EQ(tokenized->status, 200) << tokenized->body;
  const nlohmann::json ids = body_of(tokenized);
  ASSERT_TRUE(ids["tokens"].is_array()) << tokenized->body;
  EXPECT_EQ(ids["count"], ids["tokens"].size());
  EXPECT_EQ(ids["max_model_len"], 512);
  auto text = post_json(client, "/detokenize", nlohmann::json({{"tokens", ids["tokens"]}}).dump());
  ASSERT_TRUE(text);
  ASSERT_EQ(text->status, 200) << text->body;
  EXPECT_EQ(body_of(text)["prompt"], "one two three");

  auto bad = post_json(client, "/detokenize", R"({"tokens": [-1]})");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(body_of(bad)["error"]["param"], "tokens[0]");
}

TEST_F(ServerHttpTest, ModelsHealthAndMetrics) {
  auto client = rig_->client();
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  const nlohmann::json list = body_of(models);
  ASSERT_EQ(list["data"].size(), 1u) << models->body;
  EXPECT_EQ(list["data"][0]["id"], "llama-tiny");
  EXPECT_EQ(list["data"][0]["max_model_len"], 512);
  EXPECT_EQ(list["data"][0]["quantization"], "none");  // a 16-bit checkpoint

  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(body_of(health), nlohmann::json({{"status", "ok"}}));

  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u);
  EXPECT_NE(metrics->body.find("vllm:num_requests_running"), std::string::npos);
  // The two answers above are counted.
  EXPECT_NE(metrics->body.find(R"(endpoint="/v1/models")"), std::string::npos) << metrics->body;
}

TEST_F(ServerHttpTest, MetricsTimeEachGapBetweenTokensAndDescribeTheCache) {
  auto client = rig_->client();
  auto answer = post_json(client, "/v1/completions",
                          R"({"model": "llama-tiny", "prompt": "one two three", "max_tokens": 6,
                              "temperature": 0})");
  ASSERT_TRUE(answer);
  ASSERT_EQ(answer->status, 200) << answer->body;
  // Greedy and cut by max_tokens (not an end token, which is no output token): six tokens.
  ASSERT_EQ(body_of(answer)["choices"][0]["finish_reason"], "length") << answer->body;
  const int tokens = body_of(answer)["usage"]["completion_tokens"].get<int>();
  ASSERT_EQ(tokens, 6) << answer->body;

  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  const test::PromParse parsed = test::parse_prometheus_text(metrics->body);
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  const test::PromLabels model = {{"model_name", "llama-tiny"}};
  // One gap after each token but the first.
  EXPECT_EQ(test::value(parsed.families, "vllm:inter_token_latency_seconds_count", model),
            tokens - 1);
  EXPECT_GT(test::value(parsed.families, "vllm:inter_token_latency_seconds_sum", model).value_or(0),
            0);
  // The cache as the rig made it: token-major fp32 on the host, 4 slots, the model's context,
  // the host driver's granule, the tier's budget, prefixes cached.
  const LayoutPlan& plan = rig_->kv().arena().plan();
  const TierStats tier = rig_->kv().governor().stats(rig_->kv().arena().tier());
  const test::PromLabels cache = {
      {"model_name", "llama-tiny"},
      {"layout", "token-major"},
      {"cache_dtype", "fp32"},
      {"quantization", "none"},
      {"granule_bytes", std::to_string(plan.granule)},
      {"num_slots", "4"},
      {"max_context", "512"},
      {"budget_bytes", std::to_string(tier.limit)},
      {"enable_prefix_caching", "True"},
      {"block_size", std::to_string(cache_blocks(plan, tier.limit).block_size)},
      {"num_gpu_blocks", std::to_string(cache_blocks(plan, tier.limit).num_gpu_blocks)}};
  EXPECT_EQ(test::value(parsed.families, "vllm:cache_config_info", cache), 1) << metrics->body;
}

TEST_F(ServerHttpTest, UnknownPathModelAndMethodAnswerInOpenAIShape) {
  auto client = rig_->client();
  auto path = client.Get("/v1/nothing");
  ASSERT_TRUE(path);
  EXPECT_EQ(path->status, 404);
  EXPECT_EQ(body_of(path)["error"]["type"], "not_found_error") << path->body;
  EXPECT_EQ(path->get_header_value("Content-Type"), "application/json");

  auto model = post_json(client, "/v1/completions", R"({"model": "gpt-4", "prompt": "hi"})");
  ASSERT_TRUE(model);
  EXPECT_EQ(model->status, 404) << model->body;
  EXPECT_TRUE(body_of(model)["error"].contains("message"));

  auto method = client.Get("/v1/completions");
  ASSERT_TRUE(method);
  EXPECT_EQ(method->status, 405);
  EXPECT_EQ(method->get_header_value("Allow"), "POST");
  EXPECT_TRUE(body_of(method)["error"]["message"].is_string()) << method->body;
}

TEST_F(ServerHttpTest, DrainingAnswers503) {
  rig_->server().begin_drain();
  auto client = rig_->client();
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(body_of(health)["status"], "draining");
  auto request = post_json(client, "/v1/completions", R"({"model": "llama-tiny", "prompt": "a"})");
  ASSERT_TRUE(request);
  EXPECT_EQ(request->status, 503);
  EXPECT_EQ(body_of(request)["error"]["type"], "unavailable_error") << request->body;
}

TEST_F(ServerHttpTest, ADrainThatCancelsEndsAStreamWithAnErrorEvent) {
  std::string body;
  std::atomic<bool> started{false};
  int status = 0;
  std::thread client_thread([&] {
    auto client = rig_->client();
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.set_header("Content-Type", "application/json");
    request.body = R"({"model": "llama-tiny", "prompt": "The quick brown fox", )"
                   R"("max_tokens": 490, "stream": true})";
    request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t,
                                   std::uint64_t) {
      body.append(data, size);
      if (body.find("data: ") != std::string::npos) started = true;
      return true;
    };
    auto result = client.send(request);
    status = result ? result->status : -1;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!started && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // No time to finish: the drain cancels it, and the server's stop lets its end be written.
  EXPECT_FALSE(rig_->shut_down(std::chrono::milliseconds(0)));
  client_thread.join();
  EXPECT_EQ(status, 200);
  bool done = false;
  const auto events = sse_events(body, &done);
  EXPECT_TRUE(done) << body;
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["error"]["type"], "unavailable_error") << body;
  EXPECT_EQ(rig_->engine().stats().cancelled, 1u);
}

TEST_F(ServerHttpTest, ATakenPortIsRefused) {
  ServerOptions options;
  options.model_name = "llama-tiny";
  options.port = rig_->port();
  const cli::LoadedModel& model = rig_->model();
  ServerDeps deps{&rig_->engine(), &rig_->kv(), &model.config, model.tokenizer.get()};
  auto second = Server::create(deps, options);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  auto port = (*second)->bind();
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(port.status().message().find("127.0.0.1:" + std::to_string(rig_->port())),
            std::string::npos)
      << port.status().message();
}

TEST(ServerHttpChat, AdderAnswersAndEqualsGenerate) {
  ServerOptions options;
  options.model_name = "kvvm-adder";
  options.chat_renderer = tokenizer::ChatRenderer::builtin(tokenizer::ChatTemplate::kChatML);
  auto rig = ServerRig::make(test::demo_model_dir(), options);
  ASSERT_NE(rig, nullptr);

  cli::GenerateOptions generate;
  generate.model_dir = test::demo_model_dir();
  generate.chat = "What is 482 + 39?";
  generate.max_tokens = 8;
  const nlohmann::json expected = generate_json(generate);

  auto client = rig->client();
  const std::string request =
      R"({"model": "kvvm-adder", "messages": [{"role": "user", "content": "What is 482 + 39?"}],)"
      R"( "max_tokens": 8)";
  auto whole = post_json(client, "/v1/chat/completions", request + "}");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const nlohmann::json body = body_of(whole);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], expected["text"]);
  EXPECT_NE(body["choices"][0]["message"]["content"].get<std::string>().find("521"),
            std::string::npos);

  auto streamed =
      post_json(client, "/v1/chat/completions",
                request + R"(, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  bool done = false;
  const auto events = sse_events(streamed->body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const auto& event : events) {
    if (event["choices"].empty()) continue;
    const auto& delta = event["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string())
      text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(text, expected["text"].get<std::string>());
  EXPECT_EQ(events.back()["usage"]["prompt_tokens"], body["usage"]["prompt_tokens"]);
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], body["usage"]["completion_tokens"]);
}

// With ignore_eos (vLLM's extension) the adder, which ends its answer with its end token,
// goes on to max_tokens.
TEST(ServerHttpChat, IgnoreEosGeneratesMaxTokens) {
  ServerOptions options;
  options.model_name = "kvvm-adder";
  options.chat_renderer = tokenizer::ChatRenderer::builtin(tokenizer::ChatTemplate::kChatML);
  auto rig = ServerRig::make(test::demo_model_dir(), options);
  ASSERT_NE(rig, nullptr);
  auto client = rig->client();
  constexpr int kMaxTokens = 24;
  const std::string request =
      R"({"model": "kvvm-adder", "messages": [{"role": "user", "content": "What is 482 + 39?"}],)"
      R"( "max_tokens": )" +
      std::to_string(kMaxTokens);
  auto stopped = post_json(client, "/v1/chat/completions", request + "}");
  ASSERT_TRUE(stopped);
  ASSERT_EQ(stopped->status, 200) << stopped->body;
  const nlohmann::json answer = body_of(stopped);
  // The premise: without it, the end token ends the answer early.
  ASSERT_EQ(answer["choices"][0]["finish_reason"], "stop") << stopped->body;
  ASSERT_LT(answer["usage"]["completion_tokens"].get<int>(), kMaxTokens);

  auto longer = post_json(client, "/v1/chat/completions", request + R"(, "ignore_eos": true})");
  ASSERT_TRUE(longer);
  ASSERT_EQ(longer->status, 200) << longer->body;
  const nlohmann::json body = body_of(longer);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length") << longer->body;
  EXPECT_EQ(body["usage"]["completion_tokens"], kMaxTokens) << longer->body;
  EXPECT_TRUE(body["choices"][0]["message"]["content"].get<std::string>().starts_with(
      answer["choices"][0]["message"]["content"].get<std::string>()))
      << longer->body;
}

TEST(ServerHttpChat, NoTemplateAnswers400) {
  ServerOptions options;
  options.model_name = "llama-tiny";
  auto rig = ServerRig::make(test::model_fixture_dir("llama-tiny"), options);
  ASSERT_NE(rig, nullptr);
  auto client = rig->client();
  auto result =
      post_json(client, "/v1/chat/completions",
                R"({"model": "llama-tiny", "messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 400) << result->body;
}

TEST(ServerHttpKeys, KeysNameTenantsAndGuardGeneration) {
  ServerOptions options;
  options.model_name = "llama-tiny";
  auto keys = ApiKeys::parse("key-aaaa-1111 alpha\nkey-bbbb-2222 beta\n", "test keys");
  ASSERT_TRUE(keys.ok()) << keys.status().to_string();
  options.api_keys = *keys;
  auto rig = ServerRig::make(test::model_fixture_dir("llama-tiny"), options);
  ASSERT_NE(rig, nullptr);
  auto client = rig->client();
  const std::string request = R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": 2})";

  auto missing = post_json(client, "/v1/completions", request);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  EXPECT_EQ(body_of(missing)["error"]["type"], "authentication_error") << missing->body;

  auto unknown =
      post_json(client, "/v1/completions", request, {{"Authorization", "Bearer key-cccc-3333"}});
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 401);
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);

  auto good =
      post_json(client, "/v1/completions", request, {{"Authorization", "Bearer key-bbbb-2222"}});
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200) << good->body;

  // Probes need no key.
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
}

}  // namespace
}  // namespace kvvm::server
