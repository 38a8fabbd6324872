// What hostile or broken clients send: every answer is a 4xx or a closed connection, never a
// 5xx, and the server keeps serving. A client that leaves mid-stream has its request
// cancelled, and its KV comes back.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/engine_harness.h"
#include "support/server_rig.h"
#include "support/test_data.h"

namespace kvvm::server {
namespace {

using testing::post_json;
using testing::RawSocket;
using testing::ServerRig;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxBody = std::size_t{256} << 10;

class ServerHostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.model_name = "llama-tiny";
    options.max_body_bytes = kMaxBody;
    options.read_timeout = std::chrono::milliseconds(300);
    options.write_timeout = std::chrono::milliseconds(1000);
    rig_ = ServerRig::make(test::model_fixture_dir("llama-tiny"), options);
    ASSERT_NE(rig_, nullptr);
  }
  // Whatever happened, the server still answers.
  void TearDown() override {
    if (rig_ == nullptr) return;
    auto client = rig_->client();
    auto health = client.Get("/health");
    ASSERT_TRUE(health) << "the server stopped answering";
    EXPECT_EQ(health->status, 200);
  }

  // POSTs `body` to /v1/completions; expects a 4xx in OpenAI's shape and returns its message.
  std::string expect_refused(const std::string& body, int status = 400) {
    auto client = rig_->client();
    auto result = post_json(client, "/v1/completions", body);
    EXPECT_TRUE(result) << "no answer to " << body.substr(0, 80);
    if (!result) return "";
    EXPECT_EQ(result->status, status) << body.substr(0, 80) << " -> " << result->body;
    const auto json = nlohmann::json::parse(result->body, nullptr, false);
    EXPECT_TRUE(json.contains("error")) << result->body;
    if (!json.contains("error") || !json["error"]["message"].is_string()) return "";
    EXPECT_EQ(result->get_header_value("Content-Type"), "application/json");
    return json["error"]["message"];
  }

  std::unique_ptr<ServerRig> rig_;
};

TEST_F(ServerHostileTest, MalformedJsonAndWrongTypes) {
  expect_refused("{not json");
  expect_refused("");
  expect_refused(R"({"model": "llama-tiny", "prompt": "hi")");
  expect_refused(R"([1, 2, 3])");
  expect_refused(R"({"model": "llama-tiny", "prompt": 5})");
  expect_refused(R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": "ten"})");
  expect_refused(R"({"model": "llama-tiny", "prompt": "hi", "temperature": "hot"})");
  expect_refused(R"({"model": "llama-tiny", "prompt": "hi", "stream": "yes"})");
  expect_refused(R"({"model": 7, "prompt": "hi"})");
}

TEST_F(ServerHostileTest, DeepNestingIsRefusedWithoutRecursion) {
  const std::size_t depth = 100000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  expect_refused(R"({"model": "llama-tiny", "prompt": )" + nested + "}");
  expect_refused(nested);
}

TEST_F(ServerHostileTest, HugeMaxTokensAndPromptsBeyondTheContext) {
  expect_refused(R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": 1000000000000})");
  expect_refused(R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": 4294967296})");
  expect_refused(R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": 100000})");
  expect_refused(R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": -1})");
  std::string long_prompt;
  for (int i = 0; i < 1500; ++i) long_prompt += "word ";
  const std::string message =
      expect_refused(R"({"model": "llama-tiny", "prompt": ")" + long_prompt + R"("})");
  EXPECT_NE(message.find("512"), std::string::npos) << message;  // names the context
}

TEST_F(ServerHostileTest, InvalidUtf8) {
  expect_refused("{\"model\": \"llama-tiny\", \"prompt\": \"\xff\xfe\xfd\"}");
  expect_refused("{\"model\": \"llama-tiny\", \"prompt\": \"\xc0\xaf\"}");
  expect_refused("{\"model\": \"llama-tiny\", \"prompt\": \"\xed\xa0\x80\"}");  // a surrogate
}

TEST_F(ServerHostileTest, BodyOverTheLimitIs413) {
  const std::string big(std::size_t{1} << 20, 'a');
  const std::string message =
      expect_refused(R"({"model": "llama-tiny", "prompt": ")" + big + R"("})", 413);
  EXPECT_NE(message.find(std::to_string(kMaxBody)), std::string::npos) << message;
}

TEST_F(ServerHostileTest, ContentLengthOf100MBIsRefusedFromItsHeader) {
  RawSocket socket(rig_->port());
  ASSERT_TRUE(socket.connected());
  ASSERT_TRUE(
      socket.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: 104857600\r\n\r\n{\"model\":"));
  const std::string answer = socket.read_until("\r\n\r\n", std::chrono::seconds(3));
  EXPECT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u) << answer;
}

TEST_F(ServerHostileTest, SlowHeadersAreCutOffWhileOthersAreServed) {
  RawSocket slow(rig_->port());
  ASSERT_TRUE(slow.connected());
  ASSERT_TRUE(slow.send("POST /v1/compl"));
  // A well-behaved request meanwhile.
  auto client = rig_->client();
  auto result = post_json(client, "/v1/completions",
                          R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": 2})");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  // The slow one is dropped once it is silent longer than the read timeout (300 ms).
  const auto start = Clock::now();
  bool closed = false;
  const std::string answer = slow.read_until_closed(std::chrono::seconds(5), &closed);
  EXPECT_TRUE(closed);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  if (!answer.empty()) {
    EXPECT_EQ(answer.rfind("HTTP/1.1 4", 0), 0u) << answer;
  }
}

TEST_F(ServerHostileTest, AThousandDroppedConnections) {
  const auto start = Clock::now();
  for (int i = 0; i < 1000; ++i) {
    RawSocket socket(rig_->port());
    ASSERT_TRUE(socket.connected()) << "connection " << i;
    if (i % 3 == 1) socket.send("POST /v1/completions HTTP/1.1\r\nContent-Le");
    if (i % 3 == 2) socket.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  auto client = rig_->client();
  auto result = post_json(client, "/v1/completions",
                          R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": 2})");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200) << result->body;
}

// POSTs `body` (a streamed completion) on a raw connection, reads until the first event has
// arrived, then leaves abruptly (a reset, not a FIN). Returns what arrived before.
std::string stream_then_reset(std::uint16_t port, const std::string& body) {
  RawSocket socket(port);
  EXPECT_TRUE(socket.connected());
  EXPECT_TRUE(
      socket.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  "application/json\r\nContent-Length: " +
                  std::to_string(body.size()) + "\r\n\r\n" + body));
  std::string got;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  bool closed = false;
  while (got.find("data: ") == std::string::npos && !closed && Clock::now() < deadline) {
    got += socket.read_until_closed(std::chrono::milliseconds(20), &closed);
  }
  EXPECT_FALSE(closed) << got;
  socket.reset();
  return got;
}

TEST_F(ServerHostileTest, DisconnectMidStreamCancelsAndReturnsTheKv) {
  const std::string got =
      stream_then_reset(rig_->port(), R"({"model": "llama-tiny", "prompt": "The quick brown fox", )"
                                      R"("max_tokens": 490, "stream": true})");
  ASSERT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;

  // The engine hears of it at its next step.
  engine::EngineStats stats = rig_->engine().stats();
  const auto cancel_deadline = Clock::now() + std::chrono::seconds(5);
  while (stats.cancelled == 0 && stats.finished == 0 && Clock::now() < cancel_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stats = rig_->engine().stats();
  }
  EXPECT_EQ(stats.cancelled, 1u);
  EXPECT_EQ(stats.finished, 0u);
  EXPECT_EQ(stats.running, 0u);
  // The KV is all back once the engine (and its prefix cache) is gone.
  auto& kv = rig_->kv();
  rig_->end_engine();
  engine::testing::expect_clean(kv, "after a client left mid-stream");
  rig_.reset();
}

TEST_F(ServerHostileTest, DisconnectMidStreamFreesEveryChoiceOfEveryPrompt) {
  // Two prompts of three choices: six sequences, more than the rig's slots (the choices that
  // find no place wait first in line).
  const std::string got = stream_then_reset(
      rig_->port(),
      R"({"model": "llama-tiny", "prompt": ["The quick brown fox", "one two three"], )"
      R"("n": 3, "temperature": 1.0, "max_tokens": 490, "stream": true})");
  ASSERT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;

  // Both engine requests end, every choice with them.
  engine::EngineStats stats = rig_->engine().stats();
  const auto cancel_deadline = Clock::now() + std::chrono::seconds(5);
  while ((stats.cancelled < 2 || stats.running > 0) && Clock::now() < cancel_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stats = rig_->engine().stats();
  }
  EXPECT_EQ(stats.cancelled, 2u);
  EXPECT_EQ(stats.finished, 0u);
  EXPECT_EQ(stats.running, 0u);
  EXPECT_EQ(stats.waiting, 0u);
  EXPECT_EQ(stats.arena.active_slots, 0u);
  auto& kv = rig_->kv();
  rig_->end_engine();
  engine::testing::expect_clean(kv, "after a client of six choices left mid-stream");
  rig_.reset();
}

}  // namespace
}  // namespace kvvm::server
