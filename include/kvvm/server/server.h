// Server: the OpenAI-compatible HTTP front of one Engine (docs/ARCHITECTURE.md "Server").
//
// POST /v1/completions, POST /v1/chat/completions (stream: true answers Server-Sent Events
// ending in `data: [DONE]`, after a usage chunk), GET /v1/models, GET /health, GET /metrics.
// The server knows requests, not tensors: it parses a body into an EngineRequest, submits it,
// and turns the engine's events into a JSON body or SSE chunks.
//
// Structured output (response_format json_object / json_schema, vLLM's guided_* and
// structured_outputs) is compiled to a grammar on the HTTP thread before submit, through a
// cache over the tokenizer's vocabulary and the model's eos ids built at create().
//
// Errors in OpenAI's shape; nothing a client sends produces a 5xx or stops the server:
// 400 naming the field, 401 for a missing or unknown key (when keys are configured), 404 for
// an unknown path or model, 413 for a body over max_body_bytes, 429 + Retry-After when the
// engine refuses as overloaded (at submit, or later in its queue: a streamed request's
// status is sent only once it is admitted, so a refusal in the queue is still a 429), 503
// while draining.
//
// A client that disconnects mid-stream has its request cancelled (its sequence is freed at
// the engine's next step).
//
// Threading: run() serves on a pool of http_threads threads (one per connection being
// served; a streamed request holds its thread until it ends); begin_drain() and stop() may be
// called from any thread (a signal-waiting thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kvvm/base/status.h"
#include "kvvm/engine/engine.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/model/config.h"
#include "kvvm/server/api_keys.h"
#include "kvvm/tokenizer/chat_renderer.h"
#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8000;  // 0: a free port the system picks (port() tells which)
  std::string model_name;     // the id /v1/models lists and `model` must name (required)
  ApiKeys api_keys;           // empty: no key needed, one tenant
  // The model's chat template (ChatRenderer::load); nullopt: /v1/chat/completions answers 400
  // saying the model has no chat template.
  std::optional<tokenizer::ChatRenderer> chat_renderer;
  std::size_t max_body_bytes = std::size_t{8} << 20;  // larger: 413
  std::uint32_t default_max_tokens = 256;             // when a request gives none
  std::uint32_t max_n = 16;  // choices of one request (n) at most; more: 400
  // How answers to requests with tools are read into tool calls: "hermes", "llama3_json",
  // "mistral" (vLLM's --tool-call-parser names); empty: the family the chat template writes
  // calls in (none shown: requests that let the model call tools get 400).
  std::string tool_call_parser;
  // How reasoning is split out of answers (reasoning_content), as vLLM's --reasoning-parser
  // names it: "qwen3" or "deepseek_r1" (<think> blocks), "none"; empty: <think> blocks when
  // the chat template thinks in them.
  std::string reasoning_parser;
  // Compiled structured-output grammars kept by content (a schema sent with every request is
  // compiled once), the least recently used dropped first.
  std::uint32_t grammar_cache_entries = 64;
  std::uint32_t http_threads = 512;  // connections served at once; more wait in the accept queue
  // A connection silent this long while sending its request (slow headers or body), or not
  // reading what is written to it, is closed.
  std::chrono::milliseconds read_timeout{10000};
  std::chrono::milliseconds write_timeout{10000};
  std::chrono::milliseconds keep_alive_timeout{5000};  // idle keep-alive connections
};

// What the server reads; each outlives the server. The engine has been start()ed.
struct ServerDeps {
  engine::Engine* engine = nullptr;
  engine::KvSpace* kv = nullptr;  // driver call counts and the governor's tier, for /metrics
  const model::ModelConfig* config = nullptr;  // the context length and vocabulary size
  const tokenizer::Tokenizer* tokenizer = nullptr;
};

class Server {
 public:
  // InvalidArgument naming the option (empty model name, a null dependency, zero threads).
  static Result<std::unique_ptr<Server>> create(ServerDeps deps, ServerOptions options);
  ~Server();  // stop()s and waits for run() to return
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (port 0: a free one). Unavailable naming host:port when it cannot.
  Result<std::uint16_t> bind();
  std::uint16_t port() const;  // after bind()
  // Serves until stop(); returns once every connection's handler has returned.
  Status run();
  // From now on generation requests are answered 503 and /health 503 "draining"; requests
  // already accepted go on (the caller drains the engine, then calls stop()).
  void begin_drain();
  bool draining() const;
  // Stops accepting connections and makes run() return after the handlers in flight end.
  void stop();

 private:
  class Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvvm::server
