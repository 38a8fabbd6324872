// A lost GPU context (a sticky CUDA error: every later call fails the same way) ends every
// request with an error that says so, and the server answers for it: the request in hand and
// every new one get 503 "device_lost" with Retry-After, /health says not ready and why, and
// /metrics shows it, while the server stays up to say so (`kvvm serve` then exits non-zero).
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "commands/serve_command.h"
#include "support/failing_model.h"
#include "support/prometheus_text.h"
#include "support/server_rig.h"
#include "support/test_data.h"

namespace kvvm::server {
namespace {

using testing::post_json;
using testing::RigOptions;
using testing::ServerRig;

void expect_device_lost(const httplib::Result& result, const std::string& what) {
  ASSERT_TRUE(result) << what;
  EXPECT_EQ(result->status, 503) << what << ": " << result->body;
  const std::string retry_after = result->get_header_value("Retry-After");
  ASSERT_FALSE(retry_after.empty()) << what;
  EXPECT_GE(std::stoi(retry_after), 1) << retry_after;
  const auto body = nlohmann::json::parse(result->body, nullptr, false);
  ASSERT_TRUE(body.is_object()) << result->body;
  EXPECT_EQ(body["error"]["type"], "unavailable_error") << result->body;
  EXPECT_EQ(body["error"]["code"], "device_lost") << result->body;
  const std::string message = body["error"]["message"];
  EXPECT_NE(message.find("GPU context was lost"), std::string::npos) << message;
  EXPECT_NE(message.find("cudaErrorIllegalAddress"), std::string::npos) << message;
}

TEST(ServerLostContext, EveryRequestGets503AndHealthSaysWhy) {
  const std::string dir = test::model_fixture_dir("llama-tiny");
  // The context is lost at the second step: the first request's prompt ran, its answer not.
  kvvm::testing::FailingModel lost(*testing::loaded_model(dir).model, 2,
                                   kvvm::testing::illegal_address(), true);
  RigOptions rig_options;
  rig_options.model = &lost;
  ServerOptions options;
  options.model_name = "llama-tiny";
  auto rig = ServerRig::make(dir, options, rig_options);
  ASSERT_NE(rig, nullptr);
  auto client = rig->client();
  ASSERT_EQ(client.Get("/health")->status, 200);

  constexpr const char* kBody = R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": 8})";
  expect_device_lost(post_json(client, "/v1/completions", kBody), "the request in hand");
  EXPECT_EQ(lost.calls(), 2);
  EXPECT_TRUE(rig->engine().stats().context_lost);

  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  const auto said = nlohmann::json::parse(health->body, nullptr, false);
  EXPECT_EQ(said["status"], "device_lost") << health->body;
  EXPECT_NE(said["error"].get<std::string>().find("cudaErrorIllegalAddress"), std::string::npos);

  // New requests, streamed or not, never reach the model.
  expect_device_lost(post_json(client, "/v1/completions", kBody), "a new request");
  expect_device_lost(post_json(client, "/v1/chat/completions",
                               R"({"model": "llama-tiny", "stream": true, "max_tokens": 4,)"
                               R"( "messages": [{"role": "user", "content": "hi"}]})"),
                     "a new streamed chat");
  EXPECT_EQ(lost.calls(), 2);

  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  const test::PromParse parsed = test::parse_prometheus_text(metrics->body);
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  EXPECT_EQ(test::value(parsed.families, "kvvm_engine_context_lost", {}), 1.0);

  // `kvvm serve`'s wait ends on the loss (it then exits 1), with no stop asked for.
  cli::ShutdownRequest shutdown;
  EXPECT_EQ(cli::wait_for_end(shutdown, rig->engine(), std::chrono::milliseconds(1)),
            cli::ServeEnd::kContextLost);
  EXPECT_FALSE(shutdown.requested());
}

TEST(ServerLostContext, AHealthyEngineServesUntilAStopIsAskedFor) {
  const std::string dir = test::model_fixture_dir("llama-tiny");
  ServerOptions options;
  options.model_name = "llama-tiny";
  auto rig = ServerRig::make(dir, options);
  ASSERT_NE(rig, nullptr);
  auto client = rig->client();
  auto answered = post_json(client, "/v1/completions",
                            R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": 4})");
  ASSERT_TRUE(answered);
  EXPECT_EQ(answered->status, 200) << answered->body;
  EXPECT_EQ(client.Get("/health")->status, 200);
  cli::ShutdownRequest shutdown;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    shutdown.request("test");
  });
  EXPECT_EQ(cli::wait_for_end(shutdown, rig->engine(), std::chrono::milliseconds(1)),
            cli::ServeEnd::kStopRequested);
  stopper.join();
}

}  // namespace
}  // namespace kvvm::server
