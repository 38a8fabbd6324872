#include "commands/serve_command.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <utility>

#include "kit/byte_size.h"
#include "kit/cli_common.h"
#include "kit/kv_dtype_flag.h"
#include "kit/model_loading.h"
#include "kit/speculative_flag.h"
#include "kvvm/engine/engine.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/server/api_keys.h"
#include "kvvm/server/kv_events.h"
#include "kvvm/server/server.h"
#include "kvvm/tokenizer/chat_renderer.h"

namespace kvvm::cli {
namespace {

constexpr const char* kServe = "kvvm serve";
constexpr std::uint64_t kMaxWaitSeconds = 1000000;

// The directory's own name ("models/kvvm-adder/" -> "kvvm-adder").
std::string dir_name(const std::string& dir) {
  std::filesystem::path path = std::filesystem::path(dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  std::string name = path.filename().string();
  return name.empty() || name == "." || name == ".." ? std::string("model") : name;
}

// The chat template: the one asked for (its errors stop the server), else the directory's;
// none, or one that does not parse, is no error (the chat endpoint then answers 400 saying
// so, completions still serve), only a note.
Result<std::optional<tokenizer::ChatRenderer>> chat_template_of(const ServeOptions& options,
                                                                std::ostream& err) {
  Result<tokenizer::ChatRenderer> renderer =
      tokenizer::ChatRenderer::load(options.model_dir, options.chat_template);
  if (renderer.ok()) {
    err << kServe << ": chat template: " << renderer->origin() << "\n";
    return std::optional<tokenizer::ChatRenderer>(std::move(renderer).value());
  }
  if (!options.chat_template.empty()) return renderer.status().with_context("--chat-template");
  err << kServe << ": note: " << renderer.status().message()
      << "; /v1/chat/completions answers 400 until the server is started with one\n";
  return std::optional<tokenizer::ChatRenderer>();
}

// How long a server whose GPU context was lost keeps answering 503 before it exits.
constexpr std::chrono::milliseconds kLostContextGrace{1000};

// The pipe the signal handler writes to (a handler can reach only globals).
int g_signal_pipe[2] = {-1, -1};
// How often the signal waiter wakes when nothing arrives (see run_serve).
constexpr int kSignalPollMs = 100;

void forward_signal(int signal) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(signal);
  if (g_signal_pipe[1] >= 0) [[maybe_unused]]
    auto n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

void ShutdownRequest::request(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (requested_) return;
    requested_ = true;
    reason_ = reason;
  }
  changed_.notify_all();
}

bool ShutdownRequest::requested() const {
  std::lock_guard lock(mutex_);
  return requested_;
}

std::string ShutdownRequest::reason() const {
  std::lock_guard lock(mutex_);
  return reason_;
}

bool ShutdownRequest::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [this] { return requested_; });
}

void ShutdownRequest::set_ready(std::uint16_t port) {
  {
    std::lock_guard lock(mutex_);
    port_ = port;
  }
  changed_.notify_all();
}

std::optional<std::uint16_t> ShutdownRequest::wait_ready(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [this] { return port_.has_value(); });
  return port_;
}

ServeEnd wait_for_end(ShutdownRequest& shutdown, const engine::Engine& engine,
                      std::chrono::milliseconds poll) {
  while (!shutdown.wait(poll)) {
    if (!engine.health().ok()) return ServeEnd::kContextLost;
  }
  return ServeEnd::kStopRequested;
}

CLI::App* add_serve_command(CLI::App& app, ServeOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve a Hugging Face checkpoint over HTTP with OpenAI's API: POST /v1/completions, POST "
      "/v1/chat/completions (stream: true as Server-Sent Events), GET /v1/models, GET /health, "
      "GET /metrics (Prometheus). Prints one line when it listens; SIGTERM or SIGINT drain it: "
      "new requests get 503, running ones finish within --drain-timeout, then it exits. If the "
      "GPU context is lost (a sticky CUDA error), every request ends with an error saying so, "
      "new ones and /health get 503 for a second, and it exits with status 1 for a supervisor "
      "to restart it.");
  cmd->add_option("--model", options.model_dir,
                  "Checkpoint directory: config.json, tokenizer.json, model.safetensors (or "
                  "model.safetensors.index.json and its shards)")
      ->required();
  cmd->add_option("--host", options.host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", options.port, "Port to listen on; 0: a free one (default 8000)")
      ->transform(count_validator(0, 65535));
  cmd->add_option("--served-model-name", options.served_model_name,
                  "The model id requests name and /v1/models lists (default: the directory's "
                  "name)");
  cmd->add_option("--api-keys", options.api_keys_file,
                  "Key file: one 'KEY TENANT' per line; requests then need 'Authorization: "
                  "Bearer KEY', and tenants never share cached KV (default: no keys)");
  cmd->add_option("--chat-template", options.chat_template,
                  "The chat template: a Jinja file (rendered as transformers renders it), or a "
                  "built-in one: chatml, llama3, qwen3 (default: the model's own, from "
                  "chat_template.jinja or tokenizer_config.json; a built-in its tokens identify "
                  "when it ships none; none, or one that does not parse: /v1/chat/completions "
                  "answers 400)");
  cmd->add_option("--tool-call-parser", options.tool_call_parser,
                  "How answers to requests with tools are read into tool_calls, as vLLM names "
                  "its parsers: hermes (<tool_call> JSON blocks: Qwen2.5, Qwen3, Hermes), "
                  "llama3_json (Llama 3.1-3.3), mistral ([TOOL_CALLS]) (default: the family the "
                  "chat template writes calls in; none shown: requests that let the model call "
                  "tools get 400)")
      ->check(CLI::IsMember({"hermes", "llama3_json", "llama4_json", "mistral"}));
  cmd->add_option("--reasoning-parser", options.reasoning_parser,
                  "How reasoning is split out of chat answers into reasoning_content, as vLLM "
                  "names its parsers: qwen3 or deepseek_r1 (<think> blocks), none (default: "
                  "<think> blocks when the chat template thinks in them)")
      ->check(CLI::IsMember({"qwen3", "deepseek_r1", "none"}));
  cmd->add_option("--backend", options.backend,
                  "auto, cpu or cuda (default auto: cuda when a GPU is usable, else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--kv-budget", options.kv_budget,
                  "KV memory budget, e.g. 8GiB (default: 9/10 of the GPU's free memory once the "
                  "model is loaded; on the host 1 GiB)")
      ->transform(byte_size_validator(kMaxBudgetBytes, "the most a budget may be"));
  add_kv_dtype_flag(*cmd, options.kv_dtype);
  add_kv_scales_flag(*cmd, options.kv_scales);
  cmd->add_option("--max-context", options.max_context,
                  "Tokens one sequence may hold, prompt included (default: the config's "
                  "max_position_embeddings)")
      ->transform(count_validator(2, std::numeric_limits<std::uint32_t>::max()));
  cmd->add_option("--max-running", options.max_running, "Sequences generating at once (default 64)")
      ->transform(count_validator(1, 4096));
  cmd->add_option("--parked-slots", options.parked_slots,
                  "KV slots beyond --max-running where ended requests stay mapped: the next "
                  "request of the same prompt prefix takes one with the prefix still mapped, "
                  "and memory pressure takes back their own windows first; each costs a slot's "
                  "addresses only, its max context of KV (default: as many as --max-running; 0 "
                  "where the device's address space is short)")
      ->transform(count_validator(0, 4096));
  cmd->add_option("--max-queue", options.max_queue,
                  "Requests waiting at most beyond the running places still free; more are "
                  "answered 429 (default 256)")
      ->transform(count_validator(1, 1000000));
  cmd->add_option("--max-queue-wait", options.max_queue_wait,
                  "Seconds a request may wait to start before it is answered 429; 0: no limit "
                  "(default 30)")
      ->transform(number_validator(0, kMaxWaitSeconds));
  cmd->add_flag("--no-early-refusal", options.no_early_refusal,
                "Answer 429 only once a request has waited --max-queue-wait, not at once when the "
                "queue ahead of it at the measured admission rate (times how far recent "
                "predictions fell short) predicts a longer wait");
  cmd->add_flag("--no-wait-forecast", options.no_wait_forecast,
                "Predict a request's wait at arrival from the measured admission rate alone. By "
                "default the larger of that and a forecast from the work left counts: each "
                "running answer frees its place after the tokens it is expected to generate "
                "still (learned from the answers that ended), each request in line then holds "
                "the first place to free");
  cmd->add_option("--max-prefill-tokens-while-decoding", options.max_prefill_tokens_while_decoding,
                  "Prompt tokens computed in a step that also generates, at most (at most the "
                  "model's step token budget): new prompts then delay running answers less per "
                  "token, and start later (default 0: no bound but the step's)")
      ->transform(count_validator(0, std::numeric_limits<std::uint32_t>::max()));
  cmd->add_option(
         "--tpot-target-ms", options.tpot_target_ms,
         "Time per output token to keep decoding steps within, in milliseconds: each step's time "
         "is fitted as a fixed part plus a part per token, and a step that generates "
         "computes only the prompt tokens the target leaves (at least 16; within "
         "--max-prefill-tokens-while-decoding too) (default 0: no target)")
      ->transform(number_validator(0, kMaxTpotTargetMs));
  cmd->add_option(
         "--ttft-target-ms", options.ttft_target_ms,
         "Time to first token to aim for, in milliseconds: a step that generates computes more "
         "prompt tokens than --tpot-target-ms leaves when the prompts waiting for their first "
         "token would otherwise miss it (the fewest that let each still able to make it do so; "
         "within --max-prefill-tokens-while-decoding); needs --tpot-target-ms (default 0: no "
         "target)")
      ->transform(number_validator(0, kMaxTpotTargetMs));
  cmd->add_flag("--no-graphs", options.no_graphs, "Do not replay CUDA graphs for decode steps");
  add_weight_flags(*cmd, options.weights);
  cmd->add_flag("--no-prefix-cache", options.no_prefix_cache,
                "Do not share the KV of common prompt prefixes between requests");
  cmd->add_option("--kv-events-config", options.kv_events_config,
                  "KV-cache events as vLLM publishes them (ZeroMQ, msgpack), JSON as vLLM's: "
                  "enable_kv_cache_events, publisher (zmq|null), endpoint (default "
                  "tcp://*:5557), replay_endpoint, buffer_steps, hwm, max_queue_size, topic; and "
                  "kvvm's encoding (array|map) and block_size (tokens)");
  add_speculative_flag(*cmd, options.speculative_config);
  cmd->add_flag("--no-jump-forward", options.no_jump_forward,
                "Structured output: draw every token, even where the grammar allows one "
                "continuation only (by default such runs are taken without a draw, as the "
                "tokenizer writes them)");
  cmd->add_option("--default-max-tokens", options.default_max_tokens,
                  "max_tokens of a request that gives none (default 256, cut to the context)")
      ->transform(count_validator(1, std::numeric_limits<std::uint32_t>::max()));
  cmd->add_option("--max-n", options.max_n,
                  "Choices one request may ask for (n); they share the prompt's KV by fork; "
                  "more: 400 (default 16)")
      ->transform(count_validator(1, 1024));
  cmd->add_option("--max-body", options.max_body,
                  "Largest request body, e.g. 8MiB; larger: 413 (default 8MiB)")
      ->transform(byte_size_validator());
  cmd->add_option("--drain-timeout", options.drain_timeout,
                  "Seconds the running requests get to finish after SIGTERM before they are "
                  "cancelled (default 30)")
      ->transform(number_validator(0, kMaxWaitSeconds));
  cmd->add_option("--http-threads", options.http_threads,
                  "Connections served at once; more wait to be accepted (default 512)")
      ->transform(count_validator(1, 65536));
  cmd->add_option("--grammar-cache", options.grammar_cache,
                  "Compiled structured-output grammars kept (response_format json_schema, "
                  "guided_json, guided_regex, ...), so a schema sent with every request is "
                  "compiled once; the least recently used dropped first (default 64)")
      ->transform(count_validator(1, 1u << 20));
  return cmd;
}

int run_serve(const ServeOptions& options, std::ostream& out, std::ostream& err,
              ShutdownRequest& shutdown) {
  const auto fail = [&err](const Status& status) {
    err << kServe << ": " << status.to_string() << "\n";
    return exit_code(status);
  };
  if (options.max_body == 0) return fail(Status::InvalidArgument("--max-body: must be above 0"));
  server::ApiKeys keys;
  if (!options.api_keys_file.empty()) {
    Result<server::ApiKeys> loaded = server::ApiKeys::load(options.api_keys_file);
    if (!loaded.ok()) return fail(loaded.status().with_context("--api-keys"));
    keys = std::move(loaded).value();
  }
  Result<std::optional<tokenizer::ChatRenderer>> chat = chat_template_of(options, err);
  if (!chat.ok()) return fail(chat.status());

  Result<LoadedModel> loaded =
      load_model(options.model_dir, options.backend, kServe, err, options.weights);
  if (!loaded.ok()) return fail(loaded.status());
  model::Model& model = *loaded->model;
  if (Status checked = check_kv_dtype(options.kv_dtype, model, loaded->config); !checked.ok()) {
    return fail(checked);
  }

  if (options.max_prefill_tokens_while_decoding > model.limits().max_step_tokens) {
    return fail(Status::InvalidArgument("--max-prefill-tokens-while-decoding " +
                                        std::to_string(options.max_prefill_tokens_while_decoding) +
                                        ": exceeds the model's step token budget of " +
                                        std::to_string(model.limits().max_step_tokens)));
  }
  const auto running = static_cast<std::uint32_t>(options.max_running);
  engine::KvSpaceOptions kv_options;
  kv_options.backend = model.backend();
  kv_options.kv_dtype = options.kv_dtype;
  kv_options.sequences = running;  // the space adds the decode graphs' padding slot
  kv_options.parked_slots = static_cast<std::uint32_t>(options.parked_slots.value_or(running));
  kv_options.max_context = options.max_context;
  kv_options.budget_bytes = options.kv_budget;
  kv_options.driver = loaded->driver.get();
  kv_options.governor = loaded->governor.get();
  // Declared before the space and the engine: their prefix cache reports to it to the end.
  std::unique_ptr<server::KvEventsPublisher> kv_events;
  if (!options.kv_events_config.empty()) {
    Result<server::KvEventsConfig> events =
        server::parse_kv_events_config(options.kv_events_config);
    if (!events.ok()) return fail(events.status());
    if (events->publishes()) {
      if (options.no_prefix_cache) {
        return fail(Status::InvalidArgument(
            "--kv-events-config: enable_kv_cache_events with --no-prefix-cache (nothing is "
            "cached, so there is nothing to publish)"));
      }
      Result<std::unique_ptr<server::KvEventsPublisher>> made = server::make_kv_events_publisher(
          *events, model.backend() == model::Backend::kCuda ? "GPU" : "CPU");
      if (!made.ok()) return fail(made.status());
      kv_events = std::move(made).value();
      kv_options.cache_observer = kv_events.get();
      kv_options.event_block_tokens = events->block_size;
    }
  }
  Result<std::unique_ptr<engine::KvSpace>> kv = engine::KvSpace::create(loaded->config, kv_options);
  if (!kv.ok()) return fail(kv.status());
  const DType kv_dtype = (*kv)->options().kv_dtype;  // the default resolved
  if (Status applied = apply_kv_scales(options.kv_scales, kv_dtype, model); !applied.ok()) {
    return fail(applied);
  }
  print_kv_scales(kv_dtype, model, kServe, err);

  engine::EngineOptions engine_options;
  engine_options.max_running = running;
  engine_options.max_queue = static_cast<std::uint32_t>(options.max_queue);
  engine_options.max_queue_wait = seconds_to_millis(options.max_queue_wait);
  engine_options.refuse_predicted_wait = !options.no_early_refusal;
  engine_options.wait_forecast = !options.no_wait_forecast;
  engine_options.max_prefill_tokens_while_decoding =
      static_cast<std::uint32_t>(options.max_prefill_tokens_while_decoding);
  engine_options.tpot_target = tpot_target(options.tpot_target_ms);
  engine_options.ttft_target = tpot_target(options.ttft_target_ms);
  engine_options.graphs = !options.no_graphs;
  engine_options.prefix_cache = !options.no_prefix_cache;
  engine_options.jump_forward = !options.no_jump_forward;
  // Declared before the engine: they go after it.
  LoadedDraft draft;
  if (!options.speculative_config.empty()) {
    Result<engine::SpeculativeOptions> speculative =
        engine::parse_speculative_config(options.speculative_config);
    if (!speculative.ok()) return fail(speculative.status());
    engine_options.speculative = *speculative;
    Result<LoadedDraft> loaded_draft = load_draft(*speculative, *loaded, **kv, kServe, err);
    if (!loaded_draft.ok()) return fail(loaded_draft.status());
    draft = std::move(loaded_draft).value();
    engine_options.draft = draft.lent();
  }
  engine_options.tokenizer = loaded->tokenizer.get();
  Result<std::unique_ptr<engine::Engine>> engine =
      engine::Engine::create(model, **kv, engine_options);
  if (!engine.ok()) return fail(engine.status());
  if (Status started = (*engine)->start(); !started.ok()) return fail(started);

  server::ServerOptions server_options;
  server_options.host = options.host;
  server_options.port = static_cast<std::uint16_t>(options.port);
  server_options.model_name =
      options.served_model_name.empty() ? dir_name(options.model_dir) : options.served_model_name;
  server_options.api_keys = std::move(keys);
  server_options.chat_renderer = std::move(chat).value();
  server_options.max_body_bytes = options.max_body;
  server_options.default_max_tokens = static_cast<std::uint32_t>(options.default_max_tokens);
  server_options.max_n = static_cast<std::uint32_t>(options.max_n);
  server_options.http_threads = static_cast<std::uint32_t>(options.http_threads);
  server_options.grammar_cache_entries = static_cast<std::uint32_t>(options.grammar_cache);
  server_options.tool_call_parser = options.tool_call_parser;
  server_options.reasoning_parser = options.reasoning_parser;
  const std::string model_name = server_options.model_name;
  server::ServerDeps deps{engine->get(), kv->get(), &loaded->config, loaded->tokenizer.get()};
  Result<std::unique_ptr<server::Server>> made = server::Server::create(deps, server_options);
  if (!made.ok()) return fail(made.status());
  server::Server& server = **made;
  Result<std::uint16_t> port = server.bind();
  if (!port.ok()) return fail(port.status().with_context("--host / --port"));

  Status served = Status::Ok();
  std::thread serving([&] {
    served = server.run();
    // A server that stopped by itself (an accept failure) ends the command too.
    shutdown.request("the server stopped");
  });
  const TierStats tier = (*kv)->governor().stats((*kv)->arena().tier());
  out << kServe << ": " << model_name << " on http://" << options.host << ":" << *port << " ("
      << model::to_string(model.backend()) << ", KV budget " << format_bytes(tier.limit) << ", "
      << to_string(kv_dtype) << " KV, " << (*kv)->options().max_slots << " slots, "
      << kv_options.parked_slots << " of them parked)" << std::endl;
  shutdown.set_ready(*port);

  // A lost GPU context ends every request and takes the engine with it: the server answers
  // 503 (/health "device_lost") for a moment, so clients and balancers see why, then the
  // process exits non-zero for a supervisor to restart it.
  if (wait_for_end(shutdown, **engine) == ServeEnd::kContextLost) {
    const Status lost = (*engine)->health();
    err << kServe << ": " << lost.to_string() << "; answering 503 for " << kLostContextGrace.count()
        << " ms, then exiting for a supervisor to restart it" << std::endl;
    (void)shutdown.wait(kLostContextGrace);
    server.stop();
    serving.join();
    return kExitFailure;
  }
  server.begin_drain();
  const engine::EngineStats before = (*engine)->stats();
  out << kServe << ": draining (" << shutdown.reason() << "): " << before.running << " running and "
      << before.waiting << " waiting get " << options.drain_timeout
      << " s to finish; new requests get 503" << std::endl;
  const bool drained = (*engine)->drain(seconds_to_millis(options.drain_timeout));
  server.stop();
  serving.join();
  if (!served.ok()) return fail(served);
  if (!drained) {
    const engine::EngineStats after = (*engine)->stats();
    err << kServe << ": the drain timed out after " << options.drain_timeout << " s: cancelled "
        << (after.cancelled - before.cancelled) << " requests still running or queued\n";
    return kExitFailure;
  }
  out << kServe << ": stopped" << std::endl;
  return kExitOk;
}

int run_serve(const ServeOptions& options, std::ostream& out, std::ostream& err) {
  // Threads may exist before main (a BLAS library starts its pool when it loads), so blocking
  // the signals alone would leave them to one of those, and their default action would kill
  // the process. Instead: a handler that only writes the signal to a pipe (async-signal-safe),
  // the signals blocked in every thread this command starts, and one waiting thread that
  // takes them and reads the pipe.
  if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    err << kServe << ": cannot create the signal pipe\n";
    return kExitFailure;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigset_t previous_mask;
  pthread_sigmask(SIG_BLOCK, &signals, &previous_mask);
  struct sigaction action {};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  struct sigaction previous_term {
  }, previous_int{};
  sigaction(SIGTERM, &action, &previous_term);
  sigaction(SIGINT, &action, &previous_int);
  // A client that leaves must not kill the process (writes to its socket fail instead).
  std::signal(SIGPIPE, SIG_IGN);

  ShutdownRequest shutdown;
  std::thread waiter([&] {
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
    while (true) {
      // Waits in poll() with a timeout rather than in read(): a runtime that runs handlers only
      // when the thread next calls into the C library (ThreadSanitizer defers them so) would
      // otherwise never run the handler while read() blocks, and the signal would be lost.
      pollfd readable{g_signal_pipe[0], POLLIN, 0};
      const int ready = ::poll(&readable, 1, kSignalPollMs);
      if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
      unsigned char signal = 0;
      const ssize_t n = ::read(g_signal_pipe[0], &signal, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || signal == 0) return;  // 0: the command is over
      shutdown.request(signal == SIGINT ? "SIGINT" : "SIGTERM");
    }
  });
  const int code = run_serve(options, out, err, shutdown);
  const unsigned char over = 0;
  while (::write(g_signal_pipe[1], &over, 1) < 0 && errno == EINTR) {
  }
  waiter.join();
  sigaction(SIGTERM, &previous_term, nullptr);
  sigaction(SIGINT, &previous_int, nullptr);
  pthread_sigmask(SIG_SETMASK, &previous_mask, nullptr);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
  return code;
}

}  // namespace kvvm::cli
