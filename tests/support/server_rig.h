// What the server tests share: a checkpoint on the CPU, a KV space, a started engine and a
// Server over them listening on a free loopback port, served on a thread of its own; clients
// with bounded timeouts; raw sockets for what a well-behaved client never sends.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kit/model_loading.h"
#include "kvvm/engine/engine.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/server/server.h"
#include "support/test_data.h"

namespace kvvm::server::testing {

// A checkpoint loaded once per binary (the tests run one at a time; each builds its own
// engine over it).
inline cli::LoadedModel& loaded_model(const std::string& dir) {
  static std::map<std::string, std::unique_ptr<cli::LoadedModel>> cache;
  auto& slot = cache[dir];
  if (!slot) {
    std::ostringstream err;
    auto loaded = cli::load_model(dir, "cpu", "server test", err);
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    if (loaded.ok()) slot = std::make_unique<cli::LoadedModel>(std::move(loaded).value());
  }
  return *slot;
}

struct RigOptions {
  std::uint32_t slots = 4;
  std::uint64_t context = 0;       // 0: the config's
  std::uint64_t budget_bytes = 0;  // the KV tier's budget; 0: the host's default
  engine::EngineOptions engine;
  model::Model* model = nullptr;  // stands in for the checkpoint's model (it wraps it)
};

class ServerRig {
 public:
  static std::unique_ptr<ServerRig> make(const std::string& dir, ServerOptions options,
                                         RigOptions rig_options = {}) {
    std::unique_ptr<ServerRig> rig(new ServerRig());
    rig->model_ = &loaded_model(dir);
    engine::KvSpaceOptions kv_options;
    kv_options.max_slots = rig_options.slots;
    kv_options.max_context = rig_options.context;
    kv_options.budget_bytes = rig_options.budget_bytes;
    auto kv = engine::KvSpace::create(rig->model_->config, kv_options);
    EXPECT_TRUE(kv.ok()) << kv.status().to_string();
    if (!kv.ok()) return nullptr;
    rig->kv_ = std::move(kv).value();
    rig_options.engine.tokenizer = rig->model_->tokenizer.get();
    model::Model& model = rig_options.model != nullptr ? *rig_options.model : *rig->model_->model;
    auto engine = engine::Engine::create(model, *rig->kv_, rig_options.engine);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    if (!engine.ok()) return nullptr;
    rig->engine_ = std::move(engine).value();
    EXPECT_TRUE(rig->engine_->start().ok());
    if (options.model_name.empty()) options.model_name = "test-model";
    options.host = "127.0.0.1";
    options.port = 0;
    if (options.http_threads == ServerOptions{}.http_threads) options.http_threads = 16;
    ServerDeps deps{rig->engine_.get(), rig->kv_.get(), &rig->model_->config,
                    rig->model_->tokenizer.get()};
    auto server = Server::create(deps, options);
    EXPECT_TRUE(server.ok()) << server.status().to_string();
    if (!server.ok()) return nullptr;
    rig->server_ = std::move(server).value();
    auto port = rig->server_->bind();
    EXPECT_TRUE(port.ok()) << port.status().to_string();
    if (!port.ok()) return nullptr;
    rig->port_ = *port;
    rig->serving_ = std::thread([raw = rig.get()] { raw->served_ = raw->server_->run(); });
    return rig;
  }

  ~ServerRig() { end_engine(); }

  // Shuts down, then ends the server and the engine (its prefix cache lets go of every
  // entry); the KV space stays for the ledger's check.
  void end_engine() {
    shut_down();
    server_.reset();
    engine_.reset();
  }

  // The drain of `kvvm serve`: 503 from now on, the engine finishes (or cancels) what it has,
  // the server stops. Idempotent.
  bool shut_down(std::chrono::milliseconds drain = std::chrono::seconds(5)) {
    if (!serving_.joinable() || !server_) return true;
    server_->begin_drain();
    const bool drained = engine_->drain(drain);
    server_->stop();
    serving_.join();
    EXPECT_TRUE(served_.ok()) << served_.to_string();
    return drained;
  }

  httplib::Client client(std::chrono::milliseconds read_timeout = std::chrono::seconds(10)) const {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(std::chrono::seconds(2));
    client.set_read_timeout(read_timeout);
    client.set_write_timeout(std::chrono::seconds(5));
    return client;
  }

  std::uint16_t port() const { return port_; }
  Server& server() { return *server_; }
  engine::Engine& engine() { return *engine_; }
  engine::KvSpace& kv() { return *kv_; }
  const cli::LoadedModel& model() const { return *model_; }

 private:
  ServerRig() = default;
  cli::LoadedModel* model_ = nullptr;
  std::unique_ptr<engine::KvSpace> kv_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<Server> server_;
  std::uint16_t port_ = 0;
  Status served_;
  std::thread serving_;
};

// POSTs `body` as JSON; headers optional.
inline httplib::Result post_json(httplib::Client& client, const std::string& path,
                                 const std::string& body, const httplib::Headers& headers = {}) {
  return client.Post(path.c_str(), headers, body, "application/json");
}

// The JSON of an SSE body's events, [DONE] excluded; `done` says whether it ended with it.
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* done = nullptr) {
  std::vector<nlohmann::json> events;
  if (done != nullptr) *done = false;
  std::size_t from = 0;
  while (from < body.size()) {
    std::size_t end = body.find("\n\n", from);
    if (end == std::string::npos) end = body.size();
    const std::string event = body.substr(from, end - from);
    from = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      if (done != nullptr) *done = true;
      continue;
    }
    events.push_back(nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false));
  }
  return events;
}

// A raw TCP connection to the loopback port (what a well-behaved client never sends).
class RawSocket {
 public:
  explicit RawSocket(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawSocket() { close(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  bool connected() const { return connected_; }
  bool send(const std::string& data) {
    return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // Reads until the peer closes or `timeout` passes; returns what arrived and whether the
  // peer closed.
  std::string read_until_closed(std::chrono::milliseconds timeout, bool* closed) {
    std::string got;
    *closed = false;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(1, left.count()))) <= 0) continue;
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) {
        *closed = true;
        break;
      }
      got.append(buffer, static_cast<std::size_t>(n));
    }
    return got;
  }
  // Reads until what arrived holds `part` (or the peer closed, or `timeout` passed).
  std::string read_until(const std::string& part, std::chrono::milliseconds timeout) {
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (got.find(part) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      bool closed = false;
      got += read_until_closed(std::chrono::milliseconds(10), &closed);
      if (closed) break;
    }
    return got;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes with a reset (SO_LINGER 0): the peer's next write fails at once.
  void reset() {
    if (fd_ < 0) return;
    linger off{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &off, sizeof off);
    close();
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// A test whose every case talks to a fresh server on the llama-tiny fixture with default
// options.
class LlamaTinyServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.model_name = "llama-tiny";
    rig_ = ServerRig::make(test::model_fixture_dir("llama-tiny"), options);
    ASSERT_NE(rig_, nullptr);
  }
  std::unique_ptr<ServerRig> rig_;
};

}  // namespace kvvm::server::testing
