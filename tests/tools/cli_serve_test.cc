// `kvvm serve`: its options, its lifecycle in-process (a ShutdownRequest stands in for the
// signal), and the real binary drained by SIGTERM with streams in flight.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands/serve_command.h"
#include "kit/cli_common.h"
#include "support/cli_run.h"
#include "support/server_rig.h"
#include "support/test_data.h"

extern char** environ;

namespace kvvm::cli {
namespace {

using Clock = std::chrono::steady_clock;
using test::contains;
using test::run;

TEST(CliServe, HelpNamesTheOptions) {
  const test::CliRun help = run({"serve", "--help"});
  EXPECT_EQ(help.code, 0) << help.err;
  for (const char* option : {"--model",
                             "--host",
                             "--port",
                             "--served-model-name",
                             "--api-keys",
                             "--chat-template",
                             "--backend",
                             "--kv-budget",
                             "--max-context",
                             "--max-running",
                             "--max-queue",
                             "--max-queue-wait",
                             "--no-graphs",
                             "--no-prefix-cache",
                             "--default-max-tokens",
                             "--max-body",
                             "--drain-timeout",
                             "--http-threads",
                             "--no-early-refusal",
                             "--parked-slots"}) {
    EXPECT_TRUE(contains(help.out, option)) << option;
  }
  EXPECT_TRUE(contains(help.out, "--max-prefill-tokens-while-decoding"));
  EXPECT_TRUE(contains(help.out, "--tpot-target-ms"));
  EXPECT_TRUE(contains(help.out, "--ttft-target-ms"));
}

// The latency targets reach the options as given, and the engine's as microseconds; both are
// off by default.
TEST(CliServeFlags, ParseTheLatencyTargets) {
  CLI::App app("test", "kvvm");
  ServeOptions options;
  add_serve_command(app, options);
  app.parse("serve --model m", false);
  EXPECT_EQ(options.tpot_target_ms, 0);
  EXPECT_EQ(options.ttft_target_ms, 0);
  CLI::App targets_app("test", "kvvm");
  ServeOptions targets;
  add_serve_command(targets_app, targets);
  targets_app.parse("serve --model m --tpot-target-ms 40 --ttft-target-ms 1500.5", false);
  EXPECT_EQ(targets.tpot_target_ms, 40);
  EXPECT_EQ(targets.ttft_target_ms, 1500.5);
  EXPECT_EQ(tpot_target(targets.ttft_target_ms), std::chrono::microseconds(1500500));
}

TEST(CliServe, BadOptionsAreNamed) {
  const std::string model = test::model_fixture_dir("llama-tiny");
  struct Case {
    std::vector<std::string> args;
    std::string named;
  };
  const std::vector<Case> cases = {
      {{"serve"}, "--model"},
      {{"serve", "--model", model, "--port", "70000"}, "--port"},
      {{"serve", "--model", model, "--port", "-1"}, "--port"},
      {{"serve", "--model", model, "--chat-template", "alpaca"}, "--chat-template"},
      {{"serve", "--model", model, "--kv-budget", "lots"}, "--kv-budget"},
      {{"serve", "--model", model, "--max-running", "0"}, "--max-running"},
      {{"serve", "--model", model, "--drain-timeout", "soon"}, "--drain-timeout"},
      {{"serve", "--model", model, "--max-prefill-tokens-while-decoding", "-1"},
       "--max-prefill-tokens-while-decoding"},
      {{"serve", "--model", model, "--max-prefill-tokens-while-decoding", "100000"},
       "--max-prefill-tokens-while-decoding 100000"},
      {{"serve", "--model", model, "--tpot-target-ms", "-1"}, "--tpot-target-ms"},
      {{"serve", "--model", model, "--tpot-target-ms", "soon"}, "--tpot-target-ms"},
      {{"serve", "--model", model, "--ttft-target-ms", "-1"}, "--ttft-target-ms"},
      {{"serve", "--model", model, "--ttft-target-ms", "later"}, "--ttft-target-ms"},
      {{"serve", "--model", model, "--backend", "tpu"}, "--backend"},
      {{"serve", "--model", "/no/such/dir"}, "/no/such/dir"},
      {{"serve", "--model", model, "--api-keys", "/no/such/keys"}, "--api-keys"},
  };
  for (const Case& c : cases) {
    const test::CliRun result = run(c.args);
    EXPECT_EQ(result.code, 2) << c.named << ": " << result.err;
    EXPECT_TRUE(contains(result.err, c.named)) << result.err;
  }
}

TEST(CliServe, ServesUntilShutdownIsRequested) {
  ServeOptions options;
  options.model_dir = test::demo_model_dir();
  options.port = 0;
  options.backend = "cpu";
  options.max_running = 2;
  options.http_threads = 4;
  ShutdownRequest shutdown;
  std::ostringstream out, err;
  int code = -1;
  std::thread serving([&] { code = run_serve(options, out, err, shutdown); });
  const std::optional<std::uint16_t> port = shutdown.wait_ready(std::chrono::seconds(20));
  if (port) {
    httplib::Client client("127.0.0.1", *port);
    client.set_read_timeout(std::chrono::seconds(10));
    auto result = client.Post(
        "/v1/chat/completions",
        R"({"model": "kvvm-adder", "messages": [{"role": "user", "content": "What is 482 + 39?"}]})",
        "application/json");
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 200) << result->body;
    EXPECT_TRUE(contains(result->body, "521")) << result->body;
  }
  shutdown.request("test");
  serving.join();
  ASSERT_TRUE(port.has_value()) << err.str();
  EXPECT_EQ(code, 0) << err.str();
  EXPECT_TRUE(contains(out.str(), "kvvm serve: kvvm-adder on http://127.0.0.1:" +
                                      std::to_string(*port) + " (cpu, KV budget "))
      << out.str();
  // Two running, as many parked by default, and the decode graphs' padding slot.
  EXPECT_TRUE(contains(out.str(), "5 slots, 2 of them parked)")) << out.str();
  EXPECT_TRUE(contains(out.str(), "draining (test)")) << out.str();
}

// The real binary in a child process, its stdout read through a pipe.
class ServeProcess : public ::testing::Test {
 protected:
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
  }

  bool spawn(const std::vector<std::string>& args) {
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) return false;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    std::vector<std::string> all = {KVVM_CLI_PATH};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : all) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const int spawned = posix_spawn(&pid_, KVVM_CLI_PATH, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[1]);
    stdout_fd_ = pipe_fds[0];
    if (spawned != 0) pid_ = -1;
    return spawned == 0;
  }

  // Reads the child's stdout until it holds `part` or `timeout` passed.
  bool read_until(const std::string& part, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (!contains(stdout_, part) && Clock::now() < deadline) {
      pollfd p{stdout_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buffer[1024];
      const ssize_t n = ::read(stdout_fd_, buffer, sizeof buffer);
      if (n <= 0) break;
      stdout_.append(buffer, static_cast<std::size_t>(n));
    }
    return contains(stdout_, part);
  }

  // The child's exit status, or nullopt when it is still running after `timeout`.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string stdout_;
};

TEST_F(ServeProcess, SigtermDrainsStreamsInFlight) {
  ASSERT_TRUE(
      spawn({"serve", "--model", test::model_fixture_dir("llama-tiny"), "--port", "0", "--backend",
             "cpu", "--max-running", "4", "--http-threads", "8", "--drain-timeout", "20"}));
  ASSERT_TRUE(read_until(")\n", std::chrono::seconds(20))) << stdout_;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(stdout_, match, std::regex(R"(on http://127\.0\.0\.1:(\d+) \()")))
      << stdout_;
  const int port = std::stoi(match[1]);

  // Streams long enough to be running when the signal comes.
  constexpr int kStreams = 2;
  constexpr int kMaxTokens = 300;
  std::atomic<int> started{0};
  std::vector<std::string> bodies(kStreams);
  std::vector<int> statuses(kStreams, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(std::chrono::seconds(20));
      httplib::Request request;
      request.method = "POST";
      request.path = "/v1/completions";
      request.set_header("Content-Type", "application/json");
      request.body = R"({"model": "llama-tiny", "prompt": "The quick brown fox", "max_tokens": )" +
                     std::to_string(kMaxTokens) +
                     R"(, "stream": true, "stream_options": {"include_usage": true}})";
      bool counted = false;
      request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t,
                                     std::uint64_t) {
        bodies[i].append(data, size);
        if (!counted) ++started;
        counted = true;
        return true;
      };
      auto result = client.send(request);
      statuses[i] = result ? result->status : -1;
    });
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (started < kStreams && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(started, kStreams);
  // (EXPECT, not ASSERT, from here to the joins: the client threads must be joined.)
  EXPECT_EQ(::kill(pid_, SIGTERM), 0);
  EXPECT_TRUE(read_until("draining", std::chrono::seconds(10))) << stdout_;

  // A new request now: 503, or refused once the server has stopped.
  httplib::Client late("127.0.0.1", port);
  late.set_read_timeout(std::chrono::seconds(5));
  auto refused = late.Post("/v1/completions", R"({"model": "llama-tiny", "prompt": "hi"})",
                           "application/json");
  if (refused) {
    EXPECT_EQ(refused->status, 503) << refused->body;
    EXPECT_FALSE(refused->get_header_value("Retry-After").empty()) << refused->body;
  }

  for (std::thread& client : clients) client.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_EQ(statuses[i], 200);
    bool done = false;
    const auto events = server::testing::sse_events(bodies[i], &done);
    EXPECT_TRUE(done) << "stream " << i << " was cut short";
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back()["usage"]["completion_tokens"], kMaxTokens) << events.back().dump();
  }
  const std::optional<int> code = wait_exit(std::chrono::seconds(20));
  ASSERT_TRUE(code.has_value()) << "kvvm serve did not exit after SIGTERM";
  EXPECT_EQ(*code, 0) << stdout_;
}

}  // namespace
}  // namespace kvvm::cli
