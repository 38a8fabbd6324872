// Server::Impl: the routes over cpp-httplib's server, the key check, the drain flag and the
// listening lifecycle.
#include "kvvm/server/server.h"

#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>

#include "api_error.h"
#include "completion_handler.h"
#include "metrics.h"
#include "openai_request.h"
#include "openai_response.h"

namespace kvvm::server {
namespace {

constexpr const char* kJson = "application/json";

struct Route {
  const char* path;
  const char* method;
};
constexpr Route kRoutes[] = {{"/v1/completions", "POST"},
                             {"/v1/chat/completions", "POST"},
                             {"/v1/models", "GET"},
                             {"/health", "GET"},
                             {"/metrics", "GET"}};

// The metrics label of a path: a route, else "other" (a client must not grow the label set).
std::string_view endpoint_label(const std::string& path) {
  for (const Route& route : kRoutes) {
    if (path == route.path) return route.path;
  }
  return "other";
}

// The key of "Authorization: Bearer KEY" (the scheme's case is free); empty when absent.
std::string bearer_key(const httplib::Request& req) {
  const std::string value = req.get_header_value("Authorization");
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size()) return "";
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return "";
  }
  std::string_view key = std::string_view(value).substr(kScheme.size());
  while (!key.empty() && (key.front() == ' ' || key.front() == '\t')) key.remove_prefix(1);
  while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.remove_suffix(1);
  return std::string(key);
}

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

}  // namespace

class Server::Impl {
 public:
  Impl(ServerDeps deps, ServerOptions options) : deps_(deps), options_(std::move(options)) {
    created_ = std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
    context_tokens_ = static_cast<std::uint32_t>(deps_.kv->options().max_context);
    parse_context_.tokenizer = deps_.tokenizer;
    parse_context_.chat_template = options_.chat_template;
    parse_context_.model_name = options_.model_name;
    parse_context_.context_tokens = context_tokens_;
    parse_context_.vocab_size = deps_.config->vocab_size;
    parse_context_.default_max_tokens = options_.default_max_tokens;
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

  void begin_drain() { draining_ = true; }
  bool draining() const { return draining_.load(); }

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
    while (streams_in_flight_ > 0 && std::chrono::steady_clock::now() < deadline) {
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

    http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(Endpoint::kCompletions, req, res);
    });
    http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(Endpoint::kChat, req, res);
    });
    http_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      const nlohmann::json body = models_body(options_.model_name, created_, context_tokens_);
      res.set_content(dump_json(body), kJson);
    });
    http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.status = draining_ ? 503 : 200;
      res.set_content(draining_ ? R"({"status":"draining"})" : R"({"status":"ok"})", kJson);
    });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      ServerMetrics::Inputs inputs;
      inputs.model_name = options_.model_name;
      inputs.engine = deps_.engine->stats();
      inputs.driver = deps_.kv->driver().counts();
      inputs.tier = deps_.kv->governor().stats(deps_.kv->arena().tier());
      inputs.draining = draining_;
      res.set_content(metrics_.render(inputs), "text/plain; version=0.0.4; charset=utf-8");
    });
    // Anything else: 405 on a known path, 404 on an unknown one, in OpenAI's shape.
    const auto fallback = [](const httplib::Request& req, httplib::Response& res) {
      for (const Route& route : kRoutes) {
        if (req.path != route.path) continue;
        res.set_header("Allow", route.method);
        reply_error(res, error_of(405, "invalid_request_error",
                                  "method " + req.method + " is not allowed on " + req.path +
                                      " (use " + route.method + ")",
                                  "method_not_allowed"));
        return;
      }
      reply_error(res, error_of(404, "not_found_error",
                                "no such path: " + req.path +
                                    " (kvvm serves /v1/completions, "
                                    "/v1/chat/completions, /v1/models, "
                                    "/health and /metrics)",
                                "not_found"));
    };
    http_.Get(".*", fallback);
    http_.Post(".*", fallback);
    http_.Put(".*", fallback);
    http_.Patch(".*", fallback);
    http_.Delete(".*", fallback);
    http_.Options(".*", fallback);

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
    // Counted before the answer is written (httplib runs this handler just ahead of the status
    // line), so a client that reads /metrics right after an answer sees it counted.
    http_.set_post_routing_handler(
        [this](const httplib::Request& req, httplib::Response& res) { count(req, res); });
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

  // Every answer, by route and status; refusals by reason.
  void count(const httplib::Request& req, const httplib::Response& res) {
    const std::string_view endpoint = endpoint_label(req.path);
    metrics_.count_response(endpoint, res.status);
    const bool generation = endpoint == "/v1/completions" || endpoint == "/v1/chat/completions";
    switch (res.status) {
      case 401:
        metrics_.count_refusal("unauthorized");
        break;
      case 413:
        metrics_.count_refusal("too_large");
        break;
      case 429:
        metrics_.count_refusal("overloaded");
        break;
      case 503:
        if (generation) metrics_.count_refusal("draining");
        break;
      default:
        if (res.status >= 400 && res.status < 500) metrics_.count_refusal("invalid");
    }
  }

  // The tenant of the request's key (0 when no keys are configured); nullopt: answered 401.
  std::optional<std::uint64_t> tenant_of(const httplib::Request& req, httplib::Response& res) {
    if (options_.api_keys.empty()) return 0;
    const std::string key = bearer_key(req);
    if (key.empty()) {
      reply_error(res, error_of(401, "authentication_error",
                                "missing API key: send the header 'Authorization: Bearer KEY'",
                                "invalid_api_key"));
      return std::nullopt;
    }
    std::optional<std::uint64_t> tenant = options_.api_keys.tenant(key);
    if (!tenant) {
      reply_error(res, error_of(401, "authentication_error",
                                "unknown API key (the key is not "
                                "in the server's key file)",
                                "invalid_api_key"));
    }
    return tenant;
  }
  bool authorized(const httplib::Request& req, httplib::Response& res) {
    return tenant_of(req, res).has_value();
  }

  void generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    if (draining_) {
      reply_error(res, error_of(503, "unavailable_error",
                                "the server is draining: it finishes the requests it has and "
                                "takes no new ones",
                                "draining"));
      return;
    }
    const std::optional<std::uint64_t> tenant = tenant_of(req, res);
    if (!tenant) return;
    std::variant<ApiRequest, ApiError> parsed = parse_request(endpoint, req.body, parse_context_);
    if (auto* error = std::get_if<ApiError>(&parsed)) {
      reply_error(res, *error);
      return;
    }
    ApiRequest& request = std::get<ApiRequest>(parsed);
    request.engine.tenant = *tenant;
    answer_completion(CompletionContext{deps_.engine, &metrics_, &streams_in_flight_},
                      std::move(request), res);
  }

  ServerDeps deps_;
  ServerOptions options_;
  ParseContext parse_context_;
  std::uint32_t context_tokens_ = 0;
  std::int64_t created_ = 0;
  ServerMetrics metrics_;
  HttpServer http_;
  std::atomic<bool> draining_{false};
  std::atomic<int> streams_in_flight_{0};
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
