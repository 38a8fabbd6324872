// `kvvm bench serve` against a fake OpenAI server in this file (cpp-httplib on 127.0.0.1, port
// 0, its own thread): it streams SSE chunks, a usage chunk and [DONE], answers 429 +
// Retry-After to every third request and 503 to one. The report counts completions, 429s with
// their Retry-After, the 503 by status and output tokens from usage; the driver issues
// requests at their arrival times while earlier ones still stream; --duration bounds the run;
// an unreachable server is a clear error; the real `kvvm serve` completes what the bench sends
// and refuses a burst with 429s the report counts. (The pieces: cli_bench_serve_client_test.cc.)
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/drivers/serve/serve_client.h"
#include "bench/drivers/serve/serve_driver.h"
#include "bench/drivers/serve/serve_report.h"
#include "commands/serve_command.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace kvvm::cli {
namespace {

using Json = nlohmann::json;
using test::contains;
using test::run;

struct FakeOptions {
  int tokens = 3;                            // content chunks per reply
  std::chrono::milliseconds token_delay{0};  // before each content chunk
  int reject_every = 3;                      // every Nth request (1-based) gets a 429; 0: none
  std::string retry_after = "2";             // empty: a 429 without the header
  int fail_503_at = -1;                      // this request (0-based) gets a 503
  bool role_chunk = false;                   // chat: an empty role delta first, as vLLM sends
};

// A fake OpenAI-compatible server: completions and chat, streamed.
class FakeOpenAi {
 public:
  explicit FakeOpenAi(FakeOptions options) : options_(std::move(options)) {
    // Enough workers for every request of a test in flight at once (the open loop).
    server_.new_task_queue = [] { return new httplib::ThreadPool(16); };
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})",
                      "application/json");
    });
    const auto handler = [this](bool chat) {
      return [this, chat](const httplib::Request& req, httplib::Response& res) {
        handle(req, res, chat);
      };
    };
    server_.Post("/v1/completions", handler(false));
    server_.Post("/v1/chat/completions", handler(true));
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!server_.is_running() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~FakeOpenAi() {
    stopping_ = true;
    server_.stop();
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  std::vector<Json> bodies() {
    std::lock_guard<std::mutex> lock(mutex_);
    return bodies_;
  }
  // When each request arrived, from the first one.
  std::vector<double> arrivals() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<double> seconds;
    for (auto at : arrivals_) {
      seconds.push_back(std::chrono::duration<double>(at - arrivals_.front()).count());
    }
    return seconds;
  }

 private:
  // Sleeps `delay` in small steps, returning early when the server stops.
  bool pause(std::chrono::milliseconds delay) {
    const auto until = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < until) {
      if (stopping_) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return !stopping_;
  }

  void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    int n = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      n = static_cast<int>(bodies_.size());
      bodies_.push_back(Json::parse(req.body));
      arrivals_.push_back(std::chrono::steady_clock::now());
    }
    if (options_.reject_every > 0 && (n + 1) % options_.reject_every == 0) {
      res.status = 429;
      if (!options_.retry_after.empty()) res.set_header("Retry-After", options_.retry_after);
      res.set_content(R"({"error":{"message":"overloaded","type":"resource_limit_error"}})",
                      "application/json");
      return;
    }
    if (n == options_.fail_503_at) {
      res.status = 503;
      res.set_content(R"({"error":{"message":"draining","type":"unavailable"}})",
                      "application/json");
      return;
    }
    const std::size_t prompt = chat ? 0 : bodies()[n]["prompt"].size();
    // The whole stream is known up front, so it goes out with a Content-Length rather than
    // chunked: cpp-httplib's chunked writer keeps its end marker in a function-local static,
    // which ThreadSanitizer (not seeing inside the uninstrumented library's guard) reports as
    // a race between two streams ending at once.
    auto events = std::make_shared<std::vector<std::string>>();
    if (chat && options_.role_chunk) {
      events->push_back(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})");
    }
    for (int i = 0; i < options_.tokens; ++i) {
      events->push_back(chat ? R"({"choices":[{"index":0,"delta":{"content":" hi"}}]})"
                             : R"({"choices":[{"index":0,"text":" hi","finish_reason":null}]})");
    }
    events->push_back(R"({"choices":[],"usage":{"prompt_tokens":)" + std::to_string(prompt) +
                      R"(,"completion_tokens":)" + std::to_string(options_.tokens) +
                      R"(,"total_tokens":0}})");
    events->push_back("[DONE]");
    std::size_t length = 0;
    for (std::string& event : *events) {
      event = "data: " + event + "\n\n";
      length += event.size();
    }
    auto next = std::make_shared<std::size_t>(0);
    const bool has_role = chat && options_.role_chunk;
    res.set_content_provider(
        length, "text/event-stream",
        [this, events, next, has_role](std::size_t, std::size_t, httplib::DataSink& sink) {
          if (*next >= events->size()) return false;
          const bool content = *next + 2 < events->size() && !(has_role && *next == 0);
          if (content && !pause(options_.token_delay)) return false;
          const std::string& event = (*events)[(*next)++];
          return sink.write(event.data(), event.size());
        });
  }

  FakeOptions options_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::vector<Json> bodies_;
  std::vector<std::chrono::steady_clock::time_point> arrivals_;
};

std::vector<std::string> serve_args(const std::string& url, std::vector<std::string> extra) {
  std::vector<std::string> args = {"bench", "serve", "--url", url};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(CliBenchServe, CountsCompletions429sAndErrorsByStatus) {
  FakeOptions options;
  options.fail_503_at = 3;  // the 4th request (the 3rd, 6th and 9th are 429s)
  FakeOpenAi server(options);
  const test::CliRun result =
      run(serve_args(server.url(), {"--rate", "400", "--requests", "9", "--tenants", "1",
                                    "--system-prompt-tokens", "8", "--vocab", "50", "--json"}));
  ASSERT_EQ(result.code, 0) << result.err;
  const Json report = Json::parse(result.out);
  EXPECT_EQ(report["model"], "fake-model");  // from GET /v1/models
  ASSERT_EQ(report["runs"].size(), 1u);
  const Json& run = report["runs"][0];
  EXPECT_EQ(run["sent"], 9);
  EXPECT_EQ(run["completed"], 5);
  EXPECT_EQ(run["rejected_429"], 3);
  EXPECT_EQ(run["retry_after_s"]["min"], 2.0);
  EXPECT_EQ(run["retry_after_s"]["median"], 2.0);
  EXPECT_EQ(run["retry_after_s"]["max"], 2.0);
  EXPECT_EQ(run["errors"]["by_status"]["503"], 1);
  EXPECT_EQ(run["errors"]["total"], 1);
  EXPECT_EQ(run["output_tokens"], 5 * options.tokens);  // from usage
  EXPECT_EQ(run["without_usage"], 0);
  EXPECT_GT(run["output_tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(run["ttft_ms"]["samples"], 5);
  EXPECT_EQ(run["e2e_ms"]["samples"], 5);
  ASSERT_EQ(run["error_examples"].size(), 1u);
  EXPECT_TRUE(contains(run["error_examples"][0].get<std::string>(), "HTTP 503"));

  // The bodies: token ids below --vocab, the tenant's system prompt as a shared leading run,
  // streamed with usage, greedy, no field a strict server would refuse.
  const std::vector<Json> bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 9u);
  for (const Json& body : bodies) {
    EXPECT_EQ(body["model"], "fake-model");
    EXPECT_EQ(body["stream"], true);
    EXPECT_EQ(body["stream_options"]["include_usage"], true);
    EXPECT_EQ(body["temperature"], 0);
    EXPECT_GE(body["max_tokens"].get<int>(), 1);
    EXPECT_FALSE(body.contains("ignore_eos"));
    ASSERT_GT(body["prompt"].size(), 8u);
    for (const Json& id : body["prompt"]) EXPECT_LT(id.get<int>(), 50);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(body["prompt"][i], bodies[0]["prompt"][i]);
  }
  bool user_parts_differ = false;
  for (const Json& body : bodies) {
    const Json tail(body["prompt"].begin() + 8, body["prompt"].end());
    const Json first(bodies[0]["prompt"].begin() + 8, bodies[0]["prompt"].end());
    user_parts_differ = user_parts_differ || tail != first;
  }
  EXPECT_TRUE(user_parts_differ);
}

TEST(CliBenchServe, TextTableAnd429WithoutRetryAfterIsAnError) {
  FakeOptions options;
  options.retry_after = "";
  FakeOpenAi server(options);
  const test::CliRun result =
      run(serve_args(server.url(), {"--rates", "300,400", "--requests", "3", "--model", "m"}));
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "TTFT p50 ms")) << result.out;
  EXPECT_TRUE(contains(result.out, "300.00")) << result.out;
  EXPECT_TRUE(contains(result.out, "400.00")) << result.out;
  EXPECT_TRUE(contains(result.out, "HTTP 429 x 1")) << result.out;
  EXPECT_TRUE(contains(result.out, "without a valid Retry-After")) << result.out;
  EXPECT_FALSE(contains(result.out, "Retry-After min")) << result.out;
  for (const Json& body : server.bodies()) EXPECT_EQ(body["model"], "m");
}

TEST(CliBenchServe, ChatTimesTheFirstNonEmptyContent) {
  FakeOptions options;
  options.reject_every = 0;
  options.role_chunk = true;
  options.token_delay = std::chrono::milliseconds(60);
  FakeOpenAi server(options);
  const test::CliRun result =
      run(serve_args(server.url(), {"--endpoint", "chat", "--rate", "100", "--requests", "2",
                                    "--tenants", "1", "--system-prompt-tokens", "4", "--json"}));
  ASSERT_EQ(result.code, 0) << result.err;
  const Json run = Json::parse(result.out)["runs"][0];
  EXPECT_EQ(run["completed"], 2);
  // The role chunk comes at once; the first content after the token delay.
  EXPECT_GE(run["ttft_ms"]["p50"].get<double>(), 50.0);
  for (const Json& body : server.bodies()) {
    ASSERT_EQ(body["messages"].size(), 2u);
    EXPECT_EQ(body["messages"][0]["role"], "system");
    EXPECT_EQ(body["messages"][0]["content"], server.bodies()[0]["messages"][0]["content"]);
    EXPECT_EQ(body["messages"][1]["role"], "user");
    EXPECT_FALSE(body["messages"][1]["content"].get<std::string>().empty());
  }
}

// The open-loop driver's settings for streamed completions against `server`, every wait 5 s.
DriverSettings completions_against(const FakeOpenAi& server) {
  DriverSettings settings;
  settings.client.url = *parse_serve_url(server.url());
  settings.client.timeout_s = 5;
  settings.path = "/v1/completions";
  settings.grace_s = 5;
  return settings;
}

TEST(CliBenchServe, IssuesAtArrivalTimesWhileEarlierRequestsStream) {
  // Replies of 1.2 s (three tokens 0.4 s apart) against arrivals 50 ms apart: an open loop
  // issues all four while the first still streams; a closed loop would issue the last one
  // only after three replies, 3.6 s in. The margins are a second wide, so a loaded machine
  // (ThreadSanitizer on two cores, thread start and connect slowed) cannot blur the two.
  FakeOptions options;
  options.reject_every = 0;
  options.token_delay = std::chrono::milliseconds(400);
  FakeOpenAi server(options);
  DriverSettings settings = completions_against(server);
  std::vector<PlannedRequest> plan;
  const std::string body = R"({"model":"m","prompt":[1,2],"max_tokens":3,"stream":true})";
  for (double arrival : {0.0, 0.05, 0.1, 0.15}) plan.push_back({arrival, body});
  const DriverRun result = run_open_loop(plan, settings);
  ASSERT_EQ(result.requests.size(), 4u);
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const IssuedRequest& request = result.requests[i];
    ASSERT_TRUE(request.sent);
    EXPECT_EQ(request.outcome.kind, OutcomeKind::kCompleted) << request.outcome.error;
    EXPECT_GE(request.issued_s, plan[i].arrival_s);
    // Issued before the first reply ended: no request waited for another's reply.
    EXPECT_LT(request.issued_s, result.requests[0].ended_s) << "request " << i;
    ASSERT_TRUE(request.ttft_s && request.last_token_s);
    EXPECT_GE(*request.ttft_s, 0.35);  // the first token's delay
    EXPECT_EQ(request.outcome.output_tokens, 3u);
  }
  const std::vector<double> arrivals = server.arrivals();
  ASSERT_EQ(arrivals.size(), 4u);
  // All four reached the server within one reply's time of the first, not 3.6 s as a closed
  // loop would send the last.
  for (double arrival : arrivals) EXPECT_LT(arrival, 1.2);
}

TEST(CliBenchServe, ConcurrencyLimitHoldsIssueUntilASlotFrees) {
  FakeOptions options;
  options.reject_every = 0;
  options.token_delay = std::chrono::milliseconds(30);
  FakeOpenAi server(options);
  DriverSettings settings = completions_against(server);
  settings.concurrency_limit = 1;
  const std::string body = R"({"model":"m","prompt":[1],"max_tokens":3,"stream":true})";
  const std::vector<PlannedRequest> plan = {{0.0, body}, {0.0, body}, {0.0, body}};
  const DriverRun result = run_open_loop(plan, settings);
  for (std::size_t i = 1; i < plan.size(); ++i) {
    EXPECT_EQ(result.requests[i].outcome.kind, OutcomeKind::kCompleted);
    EXPECT_GE(result.requests[i].issued_s, result.requests[i - 1].ended_s) << "request " << i;
  }
  const RateReport report = summarize_run(result, plan, std::nullopt);
  EXPECT_GE(report.max_issue_lag_ms, 150.0);  // the third waited for two replies of ~90 ms
}

TEST(CliBenchServe, DurationBoundsTheRunAndCancelsWhatIsInFlight) {
  FakeOptions options;
  options.reject_every = 0;
  options.tokens = 200;  // 50 ms apart: 10 s of stream, which the bench must not wait for
  options.token_delay = std::chrono::milliseconds(50);
  FakeOpenAi server(options);
  const std::filesystem::path trace =
      std::filesystem::temp_directory_path() /
      ("kvvm-bench-serve-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
       "-" + std::to_string(server.port()) + ".jsonl");
  {
    std::ofstream out(trace);
    for (double arrival : {0.0, 0.05, 1.5, 3.0}) {
      out << R"({"arrival": )" << arrival << R"(, "prompt_tokens": 4, "output_tokens": 200})"
          << "\n";
    }
  }
  const auto started = std::chrono::steady_clock::now();
  const test::CliRun result = run(serve_args(server.url(), {"--trace", trace.string(), "--duration",
                                                            "0.3", "--timeout", "0.3", "--json"}));
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::filesystem::remove(trace);
  ASSERT_EQ(result.code, 0) << result.err;
  const Json run = Json::parse(result.out)["runs"][0];
  EXPECT_TRUE(run["rate"].is_null());
  EXPECT_EQ(run["planned"], 4);
  EXPECT_EQ(run["sent"], 2);
  EXPECT_EQ(run["not_sent"], 2);
  EXPECT_EQ(run["cancelled"], 2);
  EXPECT_EQ(run["completed"], 0);
  // 0.3 s of run + 0.3 s of grace, not the 10 s streams nor the trace's 3 s (the margin is
  // for a loaded machine: ThreadSanitizer on two cores).
  EXPECT_LT(wall, 2.5);
  EXPECT_GT(wall, 0.55);
}

TEST(CliBenchServe, UnreachableServerIsAClearError) {
  int port = 0;
  {
    FakeOpenAi gone(FakeOptions{});
    port = gone.port();
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  const test::CliRun result = run(serve_args(url, {"--requests", "1"}));
  EXPECT_EQ(result.code, 1);
  EXPECT_TRUE(contains(result.err, "cannot reach " + url)) << result.err;
  EXPECT_TRUE(contains(result.err, "is the server running?")) << result.err;
  EXPECT_TRUE(result.out.empty());

  const test::CliRun bad = run(serve_args("ftp://127.0.0.1:1", {}));
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.err, "must start with http:// or https://")) << bad.err;
}

// The real `kvvm serve` (in-process, the tiny Llama on the CPU, one request running and one
// waiting at most) under the bench: one at a time every request completes, streamed, with the
// tokens its usage reports; a burst is partly refused with 429 + Retry-After, which the report
// counts as rejections, not errors.
TEST(CliBenchServe, EndToEndAgainstKvvmServe) {
  ServeOptions serve;
  serve.model_dir = test::model_fixture_dir("llama-tiny");
  serve.served_model_name = "tiny";
  serve.backend = "cpu";
  serve.port = 0;
  serve.max_running = 1;
  serve.max_queue = 1;
  serve.http_threads = 16;
  ShutdownRequest shutdown;
  std::ostringstream serve_out, serve_err;
  int serve_code = -1;
  std::thread serving([&] { serve_code = run_serve(serve, serve_out, serve_err, shutdown); });
  const std::optional<std::uint16_t> port = shutdown.wait_ready(std::chrono::seconds(30));
  test::CliRun one_at_a_time, burst;
  if (port) {
    const std::string url = "http://127.0.0.1:" + std::to_string(*port);
    // Short prompts and outputs behind one tenant's 8-token system prompt.
    const auto bench = [&url](std::vector<std::string> args) {
      for (const char* common : {"--tenants=1", "--system-prompt-tokens=8", "--prompt-mean=6",
                                 "--max-context=64", "--timeout=20", "--json"}) {
        args.push_back(common);
      }
      return run(serve_args(url, args));
    };
    one_at_a_time =
        bench({"--rate=50", "--requests=4", "--output-mean=4", "--concurrency-limit=1"});
    burst = bench({"--rate=1000", "--requests=8", "--output-mean=16"});
  }
  shutdown.request("the test");
  serving.join();
  ASSERT_TRUE(port) << serve_err.str();
  EXPECT_EQ(serve_code, 0) << serve_err.str();
  ASSERT_EQ(one_at_a_time.code, 0) << one_at_a_time.err;
  const Json report = Json::parse(one_at_a_time.out);
  EXPECT_EQ(report["model"], "tiny");
  const Json& run = report["runs"][0];
  EXPECT_EQ(run["sent"], 4);
  EXPECT_EQ(run["completed"], 4) << run.dump();
  EXPECT_EQ(run["without_usage"], 0);
  EXPECT_GE(run["output_tokens"].get<int>(), 4);
  EXPECT_GE(run["prompt_tokens"].get<int>(), 4 * 9);  // the system prompt and a user token each
  EXPECT_EQ(run["ttft_ms"]["samples"], 4);

  ASSERT_EQ(burst.code, 0) << burst.err;
  const Json burst_run = Json::parse(burst.out)["runs"][0];
  EXPECT_EQ(burst_run["sent"], 8);
  EXPECT_GE(burst_run["rejected_429"].get<int>(), 1) << burst_run.dump();
  EXPECT_FALSE(burst_run["retry_after_s"].is_null());
  EXPECT_EQ(burst_run["errors"]["total"], 0) << burst_run.dump();
  EXPECT_EQ(burst_run["completed"].get<int>() + burst_run["rejected_429"].get<int>(), 8);
}

}  // namespace
}  // namespace kvvm::cli
