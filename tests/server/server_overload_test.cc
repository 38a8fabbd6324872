// Overload: a request the engine refuses, at submit (its queue is full) or later in its queue
// (it waited too long), is an HTTP 429 with Retry-After, streamed or not: a streamed request's
// status is sent only once it is admitted.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "support/prometheus_text.h"
#include "support/server_rig.h"
#include "support/test_data.h"

namespace kvvm::server {
namespace {

using testing::post_json;
using testing::RigOptions;
using testing::ServerRig;
using Clock = std::chrono::steady_clock;

constexpr const char* kShort = R"({"model": "llama-tiny", "prompt": "hi", "max_tokens": 4})";

// A long stream that holds the engine's only running place until it ends; its first chunk
// has arrived when start() returns.
class LongStream {
 public:
  explicit LongStream(std::uint16_t port) {
    thread_ = std::thread([this, port] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(std::chrono::seconds(20));
      httplib::Request request;
      request.method = "POST";
      request.path = "/v1/completions";
      request.set_header("Content-Type", "application/json");
      request.body =
          R"({"model": "llama-tiny", "prompt": "The quick brown fox", "max_tokens": 490, )"
          R"("stream": true})";
      request.content_receiver = [this](const char* data, std::size_t size, std::uint64_t,
                                        std::uint64_t) {
        if (std::string_view(data, size).find("data: ") != std::string_view::npos) {
          started_ = true;
        }
        return !stop_;  // false: the client leaves, and the server cancels the request
      };
      client.send(request);
    });
  }
  ~LongStream() { thread_.join(); }
  bool wait_started() {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!started_ && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return started_;
  }
  // Leaves at the next chunk, so the test need not wait for all its tokens.
  void stop() { stop_ = true; }

 private:
  std::atomic<bool> started_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void expect_429(const httplib::Result& result, const std::string& what) {
  ASSERT_TRUE(result) << what;
  EXPECT_EQ(result->status, 429) << what << ": " << result->body;
  const std::string retry_after = result->get_header_value("Retry-After");
  ASSERT_FALSE(retry_after.empty()) << what;
  EXPECT_GE(std::stoi(retry_after), 1) << retry_after;
  const auto body = nlohmann::json::parse(result->body, nullptr, false);
  EXPECT_EQ(body["error"]["type"], "resource_limit_error") << result->body;
  // The server's words and the engine's reason, "overloaded" said once.
  const std::string message = body["error"]["message"].get<std::string>();
  EXPECT_TRUE(message.starts_with("the server is overloaded: ")) << message;
  EXPECT_EQ(message.find("overloaded"), message.rfind("overloaded")) << message;
}

ServerOptions served() {
  ServerOptions options;
  options.model_name = "llama-tiny";
  return options;
}

double refused_overloaded(ServerRig& rig) {
  auto client = rig.client();
  auto metrics = client.Get("/metrics");
  if (!metrics) return -1;
  const test::PromParse parsed = test::parse_prometheus_text(metrics->body);
  EXPECT_TRUE(parsed.ok()) << parsed.error;
  return test::value(parsed.families, "kvvm_requests_refused_total", {{"reason", "overloaded"}})
      .value_or(-1);
}

TEST(ServerOverload, AFullQueueRefusesAtSubmit) {
  RigOptions rig_options;
  rig_options.engine.max_running = 1;
  rig_options.engine.max_queue = 1;
  rig_options.engine.max_queue_wait = std::chrono::milliseconds(0);  // no limit
  auto rig = ServerRig::make(test::model_fixture_dir("llama-tiny"), served(), rig_options);
  ASSERT_NE(rig, nullptr);
  {
    LongStream running(rig->port());
    ASSERT_TRUE(running.wait_started());
    // A second request waits in the queue behind it...
    std::optional<int> queued_status;
    std::thread queued([&] {
      auto client = rig->client(std::chrono::seconds(20));
      auto result = post_json(client, "/v1/completions", kShort);
      queued_status = result ? result->status : -1;
    });
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (rig->engine().stats().waiting == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(rig->engine().stats().waiting, 1u);
    // ...so a third finds the queue full.
    auto client = rig->client();
    expect_429(post_json(client, "/v1/completions", kShort), "at submit");
    running.stop();
    queued.join();
    EXPECT_EQ(queued_status, 200);  // admitted once the long one left
    const engine::EngineStats stats = rig->engine().stats();
    EXPECT_EQ(stats.cancelled, 1u);
    EXPECT_EQ(stats.finished, 1u);
  }
  EXPECT_EQ(refused_overloaded(*rig), 1);
}

TEST(ServerOverload, ARefusalInTheQueueIsStillA429WhenStreamed) {
  RigOptions rig_options;
  rig_options.engine.max_running = 1;
  rig_options.engine.max_queue_wait = std::chrono::milliseconds(1);
  auto rig = ServerRig::make(test::model_fixture_dir("llama-tiny"), served(), rig_options);
  ASSERT_NE(rig, nullptr);
  {
    LongStream running(rig->port());
    ASSERT_TRUE(running.wait_started());
    auto client = rig->client();
    expect_429(post_json(client, "/v1/completions", kShort), "whole, in the queue");
    expect_429(post_json(client, "/v1/completions",
                         R"({"model": "llama-tiny", "prompt": "hi", "stream": true})"),
               "streamed, in the queue");
    running.stop();
  }
  EXPECT_EQ(refused_overloaded(*rig), 2);
}

}  // namespace
}  // namespace kvvm::server
