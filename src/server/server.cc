// Server::Impl: cpp-httplib's server configured (sockets, timeouts, the answers it makes by
// itself) and its listening lifecycle; the routes are routes.h's.
#include "kvvm/server/server.h"

#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "api_error.h"
#include "completion_handler.h"
#include "reasoning_parser.h"
#include "routes.h"
#include "tool_call_parser.h"

namespace kvvm::server {
// Named, not anonymous: Server::Impl holds one, and GCC's -Wsubobject-linkage refuses a member
// of anonymous type once a unity build includes this file in a batch.
namespace detail {

// httplib's server, with a longer accept queue and a way to close a socket bound but never
// served.
class HttpServer : public httplib::Server {
 public:
  // httplib listens with a backlog of 5: a burst of clients beyond it would see their
  // connections dropped and retried a second later. Listening again sets the kernel's queue.
  void lengthen_accept_queue() {
    const socket_t sock = svr_sock_.load();
    if (sock != INVALID_SOCKET) ::listen(sock, SOMAXCONN);
  }
  void close_unserved_socket() {
    socket_t sock = svr_sock_.exchange(INVALID_SOCKET);
    if (sock != INVALID_SOCKET) ::close(sock);
  }
};

}  // namespace detail

class Server::Impl {
 public:
  Impl(ServerDeps deps, ServerOptions options)
      : options_(std::move(options)), routes_(deps, options_) {
    configure();
  }

  ~Impl() {
    stop();
    std::unique_lock lock(mutex_);
    run_ended_.wait(lock, [this] { return !running_; });
    if (!served_) http_.close_unserved_socket();
  }

  Result<std::uint16_t> bind() {
    const std::string where = options_.host + ":" + std::to_string(options_.port);
    int port = options_.port;
    if (options_.port == 0) {
      port = http_.bind_to_any_port(options_.host);
    } else if (!http_.bind_to_port(options_.host, options_.port)) {
      port = -1;
    }
    if (port <= 0) {
      return Status::Unavailable("cannot listen on " + where +
                                 " (the port is taken, or the host is no address of this "
                                 "machine)");
    }
    port_ = static_cast<std::uint16_t>(port);
    http_.lengthen_accept_queue();
    std::lock_guard lock(mutex_);
    bound_ = true;
    return port_.load();
  }

  std::uint16_t port() const { return port_.load(); }

  Status run() {
    {
      std::lock_guard lock(mutex_);
      if (!bound_) return Status::FailedPrecondition("Server::run() before bind()");
      if (served_) return Status::FailedPrecondition("Server::run() called twice");
      served_ = true;
      if (stop_requested_) {
        http_.close_unserved_socket();
        return Status::Ok();
      }
      running_ = true;
    }
    const bool listened = http_.listen_after_bind();
    bool stopped = false;
    {
      std::lock_guard lock(mutex_);
      running_ = false;
      stopped = stop_requested_;
    }
    run_ended_.notify_all();
    if (!listened && !stopped) {
      return Status::Unavailable("serving " + options_.host + ":" + std::to_string(port_) +
                                 " failed");
    }
    return Status::Ok();
  }

  void begin_drain() { routes_.begin_drain(); }
  bool draining() const { return routes_.draining(); }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stop_requested_ = true;
    }
    // httplib's stop() cuts every stream at its next write: let the streams in flight end
    // first. The caller has drained the engine, so they end as soon as their last chunks are
    // written, or when a client that does not read reaches the write timeout.
    const auto deadline =
        std::chrono::steady_clock::now() + options_.write_timeout + std::chrono::seconds(1);
    while (routes_.streams_in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // run() may be between its check and httplib's accept loop, where httplib's stop() does
    // nothing yet: wait until the loop runs (then stop it) or run() has returned.
    while (true) {
      if (http_.is_running()) {
        http_.stop();
        return;
      }
      {
        std::lock_guard lock(mutex_);
        if (!running_) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  void configure() {
    const std::uint32_t threads = options_.http_threads;
    http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http_.set_payload_max_length(options_.max_body_bytes);
    // httplib's default sets SO_REUSEPORT: a second server on a taken port would bind and
    // silently take half its connections. SO_REUSEADDR alone lets a restart bind at once
    // while the old connections linger, and a taken port fails the bind.
    http_.set_socket_options([](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    http_.set_read_timeout(options_.read_timeout);
    http_.set_write_timeout(options_.write_timeout);
    // httplib counts this one in whole seconds; at least one, or a fresh connection whose
    // request is a few milliseconds behind its connect would be dropped.
    const auto keep_alive = std::chrono::ceil<std::chrono::seconds>(options_.keep_alive_timeout);
    http_.set_keep_alive_timeout(std::max<time_t>(1, static_cast<time_t>(keep_alive.count())));

    routes_.install(http_);

    // What httplib answers by itself (a malformed request, a body over the limit, an unknown
    // method) gets OpenAI's shape too; answers that already have a body keep it.
    http_.set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request&, httplib::Response& res) {
          if (!res.body.empty() || res.content_provider_)
            return httplib::Server::HandlerResponse::Unhandled;
          reply_error(res, library_error(res.status));
          return httplib::Server::HandlerResponse::Handled;
        }));
    http_.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr thrown) {
          std::string what = "unknown exception";
          try {
            if (thrown) std::rethrow_exception(thrown);
          } catch (const std::exception& error) {
            what = error.what();
          } catch (...) {
          }
          reply_error(res, error_of(500, "server_error", "internal error: " + what, ""));
        });
  }

  ApiError library_error(int status) const {
    switch (status) {
      case 413:
        return error_of(413, "invalid_request_error",
                        "the request body is larger than the server's limit of " +
                            std::to_string(options_.max_body_bytes) + " bytes",
                        "request_too_large");
      case 414:
        return error_of(414, "invalid_request_error", "the request line is too long",
                        "uri_too_long");
      case 404:
        return error_of(404, "not_found_error", "no such path", "not_found");
      default:
        if (status >= 500) {
          return error_of(status, "server_error", "the server could not answer", "");
        }
        return error_of(status, "invalid_request_error", "malformed HTTP request", "bad_request");
    }
  }

  ServerOptions options_;
  Routes routes_;  // before http_: httplib's handlers and streams reach into it
  detail::HttpServer http_;
  std::atomic<std::uint16_t> port_{0};

  std::mutex mutex_;
  std::condition_variable run_ended_;
  bool bound_ = false;
  bool served_ = false;  // run() was called
  bool running_ = false;
  bool stop_requested_ = false;
};

Result<std::unique_ptr<Server>> Server::create(ServerDeps deps, ServerOptions options) {
  if (deps.engine == nullptr) return Status::InvalidArgument("ServerDeps::engine is null");
  if (deps.kv == nullptr) return Status::InvalidArgument("ServerDeps::kv is null");
  if (deps.config == nullptr) return Status::InvalidArgument("ServerDeps::config is null");
  if (deps.tokenizer == nullptr) return Status::InvalidArgument("ServerDeps::tokenizer is null");
  if (options.model_name.empty()) {
    return Status::InvalidArgument("ServerOptions::model_name is empty (--served-model-name)");
  }
  if (options.http_threads == 0) {
    return Status::InvalidArgument("ServerOptions::http_threads is 0 (--http-threads)");
  }
  if (options.max_body_bytes == 0) {
    return Status::InvalidArgument("ServerOptions::max_body_bytes is 0 (--max-body)");
  }
  if (options.default_max_tokens == 0) {
    return Status::InvalidArgument(
        "ServerOptions::default_max_tokens is 0 (--default-max-tokens): must be at least 1");
  }
  if (options.max_n == 0) {
    return Status::InvalidArgument("ServerOptions::max_n is 0 (--max-n): must be at least 1");
  }
  if (options.grammar_cache_entries == 0) {
    return Status::InvalidArgument(
        "ServerOptions::grammar_cache_entries is 0 (--grammar-cache): must be at least 1");
  }
  if (!options.tool_call_parser.empty()) {
    Result<ToolCallFormat> format = parse_tool_call_format(options.tool_call_parser);
    if (!format.ok()) {
      return Status::InvalidArgument("ServerOptions::tool_call_parser (--tool-call-parser): " +
                                     format.status().message());
    }
  }
  if (!options.reasoning_parser.empty()) {
    Result<ReasoningFormat> format = parse_reasoning_format(options.reasoning_parser);
    if (!format.ok()) {
      return Status::InvalidArgument("ServerOptions::reasoning_parser (--reasoning-parser): " +
                                     format.status().message());
    }
  }
  return std::unique_ptr<Server>(new Server(std::make_unique<Impl>(deps, std::move(options))));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;
Result<std::uint16_t> Server::bind() { return impl_->bind(); }
std::uint16_t Server::port() const { return impl_->port(); }
Status Server::run() { return impl_->run(); }
void Server::begin_drain() { impl_->begin_drain(); }
bool Server::draining() const { return impl_->draining(); }
void Server::stop() { impl_->stop(); }

}  // namespace kvvm::server
