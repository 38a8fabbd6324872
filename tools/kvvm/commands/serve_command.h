// `kvvm serve`: an OpenAI-compatible HTTP server over one model (docs/ARCHITECTURE.md "Server").
//
// It loads the checkpoint as `kvvm generate` does, builds the KV space, the engine (its own
// stepping thread) and the server, prints one line when it listens (scripts wait for it), and
// serves until SIGTERM or SIGINT: then it stops taking requests (503), lets the ones it has
// finish within --drain-timeout, and exits 0 (1 when the drain had to cancel some). If the GPU
// context is lost, it answers 503 for a second and exits 1, for a supervisor to restart it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <iosfwd>
#include <mutex>
#include <optional>
#include <string>

#include "kit/weight_flags.h"
#include "kvvm/base/dtype.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::engine {
class Engine;
}  // namespace kvvm::engine

namespace kvvm::cli {

struct ServeOptions {
  std::string model_dir;  // --model DIR (required)
  std::string host = "127.0.0.1";
  std::uint64_t port = 8000;      // 0: a free port (the ready line says which)
  std::string served_model_name;  // empty: the directory's name
  std::string api_keys_file;      // empty: no keys, one tenant
  std::string chat_template;      // NAME|FILE; empty: the directory's own template
  std::string tool_call_parser;   // hermes|llama3_json|mistral; empty: from the template
  std::string reasoning_parser;   // qwen3|deepseek_r1|none; empty: from the template
  std::string backend = "auto";   // auto | cpu | cuda
  std::uint64_t kv_budget = 0;    // bytes; 0: the KV space's default
  std::uint64_t max_context = 0;  // 0: the config's max_position_embeddings
  std::uint64_t max_running = 64;
  std::uint64_t max_queue = 256;
  std::optional<std::uint64_t> parked_slots;  // unset: as many as max_running
  double max_queue_wait = 30;                 // seconds; 0: no limit
  bool no_early_refusal = false;  // refuse only past max_queue_wait, not on a predicted wait
  bool no_wait_forecast = false;  // predict waits from the admission rate alone
  std::uint64_t max_prefill_tokens_while_decoding = 0;  // 0: no bound but the step's
  double tpot_target_ms = 0;                            // 0: no target
  double ttft_target_ms = 0;                            // 0: no target
  bool no_graphs = false;
  bool no_prefix_cache = false;
  bool no_jump_forward = false;    // --no-jump-forward: EngineOptions::jump_forward false
  std::string speculative_config;  // --speculative-config JSON; empty: off
  std::uint64_t default_max_tokens = 256;
  std::uint64_t max_n = 16;
  std::uint64_t max_body = std::uint64_t{8} << 20;
  double drain_timeout = 30;  // seconds
  std::uint64_t http_threads = 512;
  std::uint64_t grammar_cache = 64;      // compiled structured-output grammars kept
  WeightFlags weights;                   // --weight-budget, --ring-slots, --load-format
  DType kv_dtype = DType::kUnset;        // --kv-dtype; kUnset: the KV space's default
  std::string kv_scales = "checkpoint";  // --kv-scales: checkpoint or calibrate
  std::string kv_events_config;          // --kv-events-config JSON; empty: no events
};

// How a serving run is told to stop (a signal, a test) and tells when it listens.
// Thread-safe.
class ShutdownRequest {
 public:
  // Starts the drain; later calls are ignored. `reason` is printed ("SIGTERM").
  void request(const std::string& reason);
  bool requested() const;
  std::string reason() const;
  // Waits until request() was called or `timeout` passed; returns whether it was.
  bool wait(std::chrono::milliseconds timeout);

  // run_serve: the server listens on `port`.
  void set_ready(std::uint16_t port);
  // The port once the server listens; nullopt when `timeout` passed first.
  std::optional<std::uint16_t> wait_ready(std::chrono::milliseconds timeout);

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool requested_ = false;
  std::string reason_;
  std::optional<std::uint16_t> port_;
};

// Why a serving run ends: a stop was asked for (a signal, a test), or the engine lost its GPU
// context (engine::Engine::health()), after which it serves nothing and the process must be
// restarted. Waits for the first, looking at the engine every `poll`.
enum class ServeEnd { kStopRequested, kContextLost };
ServeEnd wait_for_end(ShutdownRequest& shutdown, const engine::Engine& engine,
                      std::chrono::milliseconds poll = std::chrono::milliseconds(250));

// Adds the `serve` subcommand to `app`, bound to `options`.
CLI::App* add_serve_command(CLI::App& app, ServeOptions& options);

// Serves until `shutdown` is requested (or the server fails): the ready line to `out`, notes
// and errors to `err`. kExitUsage for what the command line got wrong (a missing directory,
// an unreadable key file, an unknown template, a port that cannot be bound), kExitFailure for
// a failure at run time or a drain that timed out.
int run_serve(const ServeOptions& options, std::ostream& out, std::ostream& err,
              ShutdownRequest& shutdown);

// The command line's: SIGTERM or SIGINT requests the shutdown (taken by one thread of its
// own; the others block them). SIGPIPE is ignored.
int run_serve(const ServeOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
