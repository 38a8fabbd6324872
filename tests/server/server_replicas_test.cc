// scripts/replicas.sh end to end: three `kvvm serve` replicas of the demo model behind nginx,
// each with two running places and two in line. Under twice the load the pool holds, the
// replicas answer 429 and nginx passes each refused request on to another replica (and the
// client retries the 429 that comes back when all three refused): no request is lost, none
// answers 5xx, every sum is right. Then one replica is killed with SIGKILL mid-run: only the
// requests it held may fail, every request sent after it died is served, streams included.
// Skipped, saying so, where nginx is not installed; not built under a sanitizer (the replicas
// would be sanitized builds, 5-30x slower, and the sanitized suites run the server's own tests).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "support/prometheus_text.h"
#include "support/server_rig.h"

extern char** environ;

#if defined(KVVM_CLI_PATH) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)

namespace kvvm::server::replicas_test {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kReplicas = 3;
constexpr int kRunning = 2;  // --max-running of each replica
constexpr int kQueue = 2;    // --max-queue of each replica
constexpr int kPlaces = kRunning + kQueue;

std::optional<std::string> find_nginx() {
  for (const char* path : {"/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"}) {
    if (::access(path, X_OK) == 0) return std::string(path);
  }
  const char* env_path = std::getenv("PATH");
  std::string dirs = env_path != nullptr ? env_path : "";
  std::size_t from = 0;
  while (from <= dirs.size()) {
    std::size_t end = dirs.find(':', from);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(from, end - from) + "/nginx";
    if (end > from && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    from = end + 1;
  }
  return std::nullopt;
}

struct Replica {
  pid_t pid = 0;
  int port = 0;
};

// scripts/replicas.sh in a process group of its own, its stdout read through a pipe.
class ReplicaSet {
 public:
  ~ReplicaSet() {
    if (pid_ > 0 && !stop(std::chrono::seconds(20))) {
      ::kill(-pid_, SIGKILL);  // the script's group: what it started and failed to stop
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
  }

  // Starts the script and waits for its nginx line; false (with the output) when it fails.
  bool start(std::string& output) {
    const std::string root = std::string(KVVM_TEST_DATA_DIR) + "/../..";
    std::vector<std::string> args = {
        "bash", root + "/scripts/replicas.sh", "--kvvm", KVVM_CLI_PATH, "--model",
        root + "/models/kvvm-adder", "--replicas", std::to_string(kReplicas), "--port", "0",
        // Should this process die unannounced (a CTest timeout),
        // the script stops the replicas and nginx itself.
        "--watch-pid", std::to_string(::getpid()), "--", "--max-running", std::to_string(kRunning),
        "--max-queue", std::to_string(kQueue), "--drain-timeout", "5"};
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) return false;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    // Its errors too: nothing it starts holds the test runner's own output open.
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const int spawned = posix_spawnp(&pid_, "bash", &actions, &attributes, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    ::close(pipe_fds[1]);
    stdout_fd_ = pipe_fds[0];
    if (spawned != 0) {
      pid_ = -1;
      return false;
    }
    const bool up = read_until(" on http://", "nginx (pid", std::chrono::seconds(60));
    output = stdout_;
    if (!up) return false;
    const std::regex replica(R"(replica \d+ \(pid (\d+)\) on http://127\.0\.0\.1:(\d+))");
    for (std::sregex_iterator it(stdout_.begin(), stdout_.end(), replica), end; it != end; ++it) {
      replicas_.push_back({static_cast<pid_t>(std::stol((*it)[1])), std::stoi((*it)[2])});
    }
    std::smatch nginx;
    if (!std::regex_search(stdout_, nginx,
                           std::regex(R"(nginx \(pid \d+.*on http://127\.0\.0\.1:(\d+))"))) {
      return false;
    }
    port_ = std::stoi(nginx[1]);
    return static_cast<int>(replicas_.size()) == kReplicas;
  }

  // SIGTERM to the script, which stops nginx and drains the replicas; false when it is still
  // running after `timeout`. The exit status in exit_status().
  bool stop(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return true;
    ::kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      read_until("\x01", "\x01", std::chrono::milliseconds(20));  // keeps the pipe drained
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_status_ = status;
        pid_ = -1;
        return true;
      }
    }
    return false;
  }

  int port() const { return port_; }
  const std::vector<Replica>& replicas() const { return replicas_; }
  int exit_status() const { return exit_status_; }
  const std::string& output() const { return stdout_; }

 private:
  // Reads stdout until it holds a line containing both parts, or `timeout` passed.
  bool read_until(const std::string& part, const std::string& also,
                  std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    const auto found = [&] {
      std::size_t at = stdout_.find(also);
      return at != std::string::npos && stdout_.find(part, at) != std::string::npos &&
             stdout_.find('\n', at) != std::string::npos;
    };
    while (!found() && Clock::now() < deadline) {
      pollfd p{stdout_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buffer[1024];
      const ssize_t n = ::read(stdout_fd_, buffer, sizeof buffer);
      if (n <= 0) break;
      stdout_.append(buffer, static_cast<std::size_t>(n));
    }
    return found();
  }

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string stdout_;
  std::vector<Replica> replicas_;
  int port_ = 0;
  int exit_status_ = -1;
};

httplib::Client client_for(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(std::chrono::seconds(2));
  client.set_read_timeout(std::chrono::seconds(30));
  client.set_write_timeout(std::chrono::seconds(5));
  return client;
}

enum class Outcome { kServed, kWrongAnswer, kServerError, kTransport, kTruncated };

struct Answer {
  Outcome outcome = Outcome::kTransport;
  int refusals = 0;  // 429s that reached the client (every replica nginx tried refused)
  std::string detail;
};

// "What is a + b?" through nginx, streamed or not; a 429 is retried after a short pause (its
// Retry-After, at most 50 ms, to keep the test short), as a client of an overloaded pool does.
Answer ask(httplib::Client& client, int a, int b, bool stream) {
  nlohmann::json message = nlohmann::json::object();
  message["role"] = "user";
  message["content"] = "What is " + std::to_string(a) + " + " + std::to_string(b) + "?";
  nlohmann::json request_json = nlohmann::json::object();
  request_json["model"] = "kvvm-adder";
  request_json["messages"] = nlohmann::json::array({message});
  request_json["max_tokens"] = 8;
  request_json["temperature"] = 0;
  request_json["stream"] = stream;
  const std::string body = request_json.dump();
  const std::string expected = std::to_string(a + b);
  Answer answer;
  for (int attempt = 0; attempt < 2000; ++attempt) {
    std::string received;
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/chat/completions";
    request.set_header("Content-Type", "application/json");
    request.body = body;
    if (stream) {
      request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t,
                                     std::uint64_t) {
        received.append(data, size);
        return true;
      };
    }
    auto result = client.send(request);
    if (!result) {
      answer.outcome = Outcome::kTransport;
      answer.detail = httplib::to_string(result.error());
      // A stream cut mid-way after its 200 shows as a read error once bytes came.
      if (!received.empty()) answer.outcome = Outcome::kTruncated;
      return answer;
    }
    if (result->status == 429) {
      ++answer.refusals;
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + attempt % 45));
      continue;
    }
    if (result->status >= 500) {
      answer.outcome = Outcome::kServerError;
      answer.detail = std::to_string(result->status) + " " + result->body;
      return answer;
    }
    std::string content;
    if (stream) {
      bool done = false;
      for (const nlohmann::json& event : testing::sse_events(received, &done)) {
        if (!event.is_object() || !event.contains("choices") || event["choices"].empty()) continue;
        const nlohmann::json& delta = event["choices"][0]["delta"];
        if (delta.contains("content") && delta["content"].is_string()) {
          content += delta["content"].get<std::string>();
        }
      }
      if (!done) {
        answer.outcome = Outcome::kTruncated;
        answer.detail = received;
        return answer;
      }
    } else {
      const auto json = nlohmann::json::parse(result->body, nullptr, false);
      if (json.is_object() && json.contains("choices")) {
        content = json["choices"][0]["message"]["content"].get<std::string>();
      }
    }
    answer.outcome = content == expected ? Outcome::kServed : Outcome::kWrongAnswer;
    answer.detail = std::to_string(result->status) + ": '" + content + "' for " +
                    std::to_string(a) + " + " + std::to_string(b);
    return answer;
  }
  answer.outcome = Outcome::kServerError;
  answer.detail = "refused 2000 times";
  return answer;
}

// The overload refusals a replica counted (kvvm_requests_refused_total{reason="overloaded"}).
double refused_overloaded(int port) {
  auto client = client_for(port);
  auto metrics = client.Get("/metrics");
  if (!metrics || metrics->status != 200) return -1;
  const test::PromParse parsed = test::parse_prometheus_text(metrics->body);
  return test::value(parsed.families, "kvvm_requests_refused_total", {{"reason", "overloaded"}})
      .value_or(-1);
}

// Whether `pid` (not a child of this process) has died within `timeout`: /proc shows it a
// zombie, or no more.
bool wait_until_dead(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string stat = "/proc/" + std::to_string(pid) + "/stat";
  while (Clock::now() < deadline) {
    std::ifstream file(stat);
    std::string line;
    if (!std::getline(file, line)) return true;
    // "pid (comm) S ...": the state follows the last ')'.
    const std::size_t paren = line.rfind(')');
    if (paren == std::string::npos || paren + 2 >= line.size()) return true;
    const char state = line[paren + 2];
    if (state == 'Z' || state == 'X') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

struct Tally {
  std::mutex mutex;
  int served = 0;
  int refusals_seen = 0;
  std::vector<std::string> failures;  // not served: why
  void add(const Answer& answer) {
    std::lock_guard<std::mutex> lock(mutex);
    refusals_seen += answer.refusals;
    if (answer.outcome == Outcome::kServed) {
      ++served;
    } else {
      failures.push_back(answer.detail);
    }
  }
};

TEST(Replicas, BehindNginxNoRequestIsLostAndAKilledReplicaLosesOnlyItsOwn) {
  if (!find_nginx()) {
    GTEST_SKIP() << "nginx is not installed (Debian: apt-get install nginx, which "
                    "scripts/test.sh does): scripts/replicas.sh is not tested";
  }
  ReplicaSet set;
  std::string output;
  ASSERT_TRUE(set.start(output)) << output;
  const int port = set.port();

  // Twice the places of the pool, each client sending back to back.
  {
    Tally tally;
    constexpr int kClients = 2 * kReplicas * kPlaces;
    constexpr int kEach = 12;
    std::vector<std::thread> clients;
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        auto client = client_for(port);
        std::mt19937 rng(static_cast<std::uint32_t>(c));
        std::uniform_int_distribution<int> number(0, 999);
        for (int i = 0; i < kEach; ++i)
          tally.add(ask(client, number(rng), number(rng), c % 3 == 0));
      });
    }
    for (std::thread& client : clients) client.join();
    EXPECT_EQ(tally.served, kClients * kEach);
    for (const std::string& failure : tally.failures) ADD_FAILURE() << failure;
    double refused = 0;
    for (const Replica& replica : set.replicas()) refused += refused_overloaded(replica.port);
    // The replicas did refuse: the load was an overload, and nginx carried it.
    EXPECT_GT(refused, 0);
    std::cout << "[ overload ] " << tally.served << " served, " << refused << " replica 429s, "
              << tally.refusals_seen << " reached the client\n";
  }

  // One replica killed mid-run, at the pool's full load.
  {
    Tally before, after;
    std::atomic<bool> killed{false};
    std::atomic<bool> stop{false};
    constexpr int kClients = kReplicas * kPlaces;
    std::vector<std::thread> clients;
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        auto client = client_for(port);
        std::mt19937 rng(static_cast<std::uint32_t>(100 + c));
        std::uniform_int_distribution<int> number(0, 999);
        while (!stop) {
          const bool sent_after_kill = killed;
          const Answer answer = ask(client, number(rng), number(rng), c % 2 == 0);
          (sent_after_kill ? after : before).add(answer);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const Replica victim = set.replicas()[1];
    ASSERT_EQ(::kill(victim.pid, SIGKILL), 0);
    // Requests count as sent after the kill once the replica is dead (a zombie of the script,
    // or reaped), not merely signalled: until then it may still begin a stream.
    EXPECT_TRUE(wait_until_dead(victim.pid, std::chrono::seconds(5)));
    killed = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    stop = true;
    for (std::thread& client : clients) client.join();
    EXPECT_GT(before.served, 0);
    EXPECT_GT(after.served, 0);
    // What the killed replica held may fail, nothing more.
    EXPECT_LE(before.failures.size(), static_cast<std::size_t>(kPlaces));
    for (const std::string& failure : before.failures) {
      std::cout << "[ killed   ] lost in flight: " << failure << "\n";
    }
    for (const std::string& failure : after.failures)
      ADD_FAILURE() << "after the kill: " << failure;
    std::cout << "[ killed   ] " << before.served << " served before the kill, "
              << before.failures.size() << " lost; " << after.served << " after it\n";
  }

  // SIGTERM: the script stops nginx and drains the two replicas left.
  ASSERT_TRUE(set.stop(std::chrono::seconds(20))) << set.output();
  EXPECT_TRUE(WIFEXITED(set.exit_status())) << set.exit_status();
  EXPECT_NE(set.output().find("replicas.sh: stopped"), std::string::npos) << set.output();
  for (const Replica& replica : set.replicas()) {
    EXPECT_NE(::kill(replica.pid, 0), 0) << "replica pid " << replica.pid << " outlived the script";
  }
}

}  // namespace
}  // namespace kvvm::server::replicas_test

#endif
