#include "bench/drivers/serve/serve.h"

#include <CLI/CLI.hpp>
#include <fstream>
#include <limits>
#include <ostream>
#include <utility>
#include <vector>

#include "bench/drivers/serve/serve_request.h"
#include "kit/cli_common.h"
#include "kit/text_table.h"
#include "kit/value_parsers.h"

namespace kvvm::cli {
namespace {

constexpr const char* kBenchServe = "kvvm bench serve";
constexpr double kMaxRunSeconds = 1e7;
constexpr double kMaxMeanTokens = 1e6;

// One run to make: its rate (none for a trace file) and its requests.
struct RunPlan {
  std::optional<double> rate;
  std::vector<PlannedRequest> requests;
};

std::vector<PlannedRequest> plan_requests(const Trace& trace, const BenchServeOptions& options,
                                          const std::string& model) {
  std::vector<PlannedRequest> plan;
  std::size_t count = trace.requests.size();
  if (options.max_requests > 0 && options.max_requests < count) count = options.max_requests;
  plan.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const TraceRequest& request = trace.requests[i];
    const std::vector<TokenId> ids = prompt_ids(trace, i, options.seed, options.vocab);
    PlannedRequest planned;
    planned.arrival_s = request.arrival_s;
    planned.body = options.endpoint == "chat"
                       ? chat_body(model, ids, request.prefix_tokens, request.output_tokens)
                       : completion_body(model, ids, request.output_tokens);
    plan.push_back(std::move(planned));
  }
  return plan;
}

// The traces, one per rate (or the file's), checked before the server is contacted.
Result<std::vector<std::pair<std::optional<double>, Trace>>> make_traces(
    const BenchServeOptions& options, std::ostream& err) {
  std::vector<std::pair<std::optional<double>, Trace>> traces;
  if (!options.trace_file.empty()) {
    KVVM_RETURN_IF_ERROR(check_input_file("--trace", options.trace_file));
    std::ifstream in(options.trace_file);
    if (!in) {
      return Status::InvalidArgument("--trace " + options.trace_file + ": cannot open the file");
    }
    Result<Trace> trace = read_jsonl_trace(in, options.trace_file, options.max_context);
    if (!trace.ok()) return trace.status().with_context("--trace " + options.trace_file);
    for (const std::string& error : trace->errors) {
      err << kBenchServe << ": skipped " << error << "\n";
    }
    if (trace->requests.empty()) {
      return Status::InvalidArgument("--trace " + options.trace_file + " holds no valid request");
    }
    traces.emplace_back(std::nullopt, std::move(trace).value());
    return traces;
  }
  std::vector<double> rates = {options.rate};
  if (!options.rates.empty()) {
    KVVM_ASSIGN_OR_RETURN(std::vector<double> parsed,
                          parse_rate_list(options.rates, "--rates", kMaxRate));
    rates = std::move(parsed);
  }
  for (double rate : rates) {
    TraceGeneratorOptions generator;
    generator.requests = options.requests;
    generator.rate = rate;
    generator.tenants = options.tenants;
    generator.system_prompt_tokens = options.system_prompt_tokens;
    generator.prompt_mu = lognormal_mu(options.prompt_mean, generator.prompt_sigma);
    generator.output_mu = lognormal_mu(options.output_mean, generator.output_sigma);
    generator.max_context = options.max_context;
    generator.seed = options.seed;
    KVVM_ASSIGN_OR_RETURN(Trace trace, generate_trace(generator));
    traces.emplace_back(rate, std::move(trace));
  }
  return traces;
}

}  // namespace

CLI::App* add_bench_serve_command(CLI::App& bench, BenchServeOptions& options) {
  CLI::App* cmd = bench.add_subcommand(
      "serve",
      "Load an OpenAI-compatible server (kvvm serve, vLLM, bench/serve_hf.py) open loop: "
      "requests are issued at their trace arrival times whatever the server's progress, "
      "streamed, and reported per rate: sent, completed, 429s with their Retry-After, errors "
      "by HTTP status, output tokens/s, time to first token, time per output token and "
      "end-to-end latency (p50, p99). Prompts are token ids drawn from --seed (completions) or "
      "a word per id (chat); a tenant's requests share a leading system prompt.");
  cmd->add_option("--url", options.url, "The server, e.g. http://127.0.0.1:8000")->required();
  cmd->add_option("--model", options.model,
                  "Model name to send (default: the first id of GET /v1/models)");
  cmd->add_option("--api-key", options.api_key, "Sent as 'Authorization: Bearer KEY'");
  cmd->add_option("--endpoint", options.endpoint,
                  "completions (token-id prompts) or chat (text prompts) (default completions)")
      ->check(CLI::IsMember({"completions", "chat"}));
  CLI::Option* trace = cmd->add_option(
      "--trace", options.trace_file,
      "Replay this JSONL trace (kvvm simulate's format) at its own arrival times instead of "
      "generating one");
  CLI::Option* rate =
      cmd->add_option("--rate", options.rate, "Poisson arrival rate, requests/s (default 4)")
          ->transform(number_validator(0, kMaxRate, /*min_exclusive=*/true));
  CLI::Option* rates = cmd->add_option(
      "--rates", options.rates, "Several rates, comma-separated: one run and one report each");
  CLI::Option* requests =
      cmd->add_option("--requests", options.requests, "Generated requests per rate (default 16)")
          ->transform(count_validator(1, kMaxRequests));
  CLI::Option* tenants =
      cmd->add_option("--tenants", options.tenants,
                      "Tenants; each request starts with its tenant's system prompt (default 2; "
                      "0: none)")
          ->transform(count_validator(0, kMaxPrefixGroups));
  CLI::Option* system_prompt =
      cmd->add_option("--system-prompt-tokens", options.system_prompt_tokens,
                      "Tokens of each tenant's system prompt (default 32)")
          ->transform(count_validator(1, kMaxTokens));
  CLI::Option* prompt_mean =
      cmd->add_option("--prompt-mean", options.prompt_mean,
                      "Mean user prompt tokens, log-normal with sigma 1.0 (default 32)")
          ->transform(number_validator(1, kMaxMeanTokens));
  CLI::Option* output_mean =
      cmd->add_option("--output-mean", options.output_mean,
                      "Mean output tokens (max_tokens), log-normal with sigma 0.8 (default 16)")
          ->transform(number_validator(1, kMaxMeanTokens));
  cmd->add_option("--seed", options.seed, "Seed of the trace and the prompt ids (default 1)")
      ->transform(count_validator(0, std::numeric_limits<std::uint64_t>::max()));
  cmd->add_option("--max-context", options.max_context,
                  "Prompt + output tokens of one request never exceed this (default 4096)")
      ->transform(count_validator(2, kMaxContextTokens));
  cmd->add_option("--vocab", options.vocab,
                  "Prompt token ids are drawn from [0, VOCAB) (default 1000)")
      ->transform(count_validator(1, std::numeric_limits<std::uint32_t>::max()));
  cmd->add_option("--max-requests", options.max_requests,
                  "Send at most the first N requests of each trace (default 0: all)")
      ->transform(count_validator(0, kMaxRequests));
  cmd->add_option_function<double>(
         "--duration", [&options](const double& seconds) { options.duration_s = seconds; },
         "Stop issuing after this many seconds; requests still in flight get --timeout more, "
         "then are cancelled")
      ->transform(number_validator(0, kMaxRunSeconds, /*min_exclusive=*/true));
  cmd->add_option("--timeout", options.timeout_s,
                  "Seconds: the longest wait for one read from the server, and for the requests "
                  "in flight once issuing stopped (default 60)")
      ->transform(number_validator(0, kMaxRunSeconds, /*min_exclusive=*/true));
  cmd->add_option("--concurrency-limit", options.concurrency_limit,
                  "At most this many requests in flight; a request past it waits for a free "
                  "slot (default 0: unbounded open loop)")
      ->transform(count_validator(0, std::numeric_limits<std::uint32_t>::max()));
  cmd->add_flag("--json", options.json, "Machine-readable report (JSON) on stdout");
  for (CLI::Option* generator :
       {rate, rates, requests, tenants, system_prompt, prompt_mean, output_mean}) {
    trace->excludes(generator);
  }
  rate->excludes(rates);
  cmd->footer(
      "Progress lines go to stderr. Exit status: 0 the runs completed (429s and errors are "
      "reported, not failures), 1 the server could not be reached, 2 bad usage.");
  return cmd;
}

int run_bench_serve(const BenchServeOptions& options, std::ostream& out, std::ostream& err) {
  const auto fail = [&err](const Status& status, int code) {
    err << kBenchServe << ": " << status.to_string() << "\n";
    return code;
  };
  Result<ServeUrl> url = parse_serve_url(options.url);
  if (!url.ok()) return fail(url.status(), kExitUsage);
  Result<std::vector<std::pair<std::optional<double>, Trace>>> traces = make_traces(options, err);
  if (!traces.ok()) return fail(traces.status(), kExitUsage);

  ClientSettings client;
  client.url = *url;
  client.api_key = options.api_key;
  client.timeout_s = options.timeout_s;
  client.connect_s = std::min(options.timeout_s, 10.0);
  std::string model = options.model;
  Result<std::vector<std::string>> models = list_models(client);
  if (!models.ok() && models.status().code() == StatusCode::kUnavailable) {
    return fail(Status::Unavailable(models.status().message() + " (is the server running?)"),
                kExitFailure);
  }
  if (model.empty()) {
    if (!models.ok()) return fail(models.status(), kExitFailure);
    model = models->front();
  }

  BenchServeReport report;
  report.url = options.url;
  report.model = model;
  report.endpoint = options.endpoint;
  report.trace = options.trace_file.empty() ? "generated" : options.trace_file;
  report.concurrency_limit = options.concurrency_limit;
  report.duration_s = options.duration_s;
  report.timeout_s = options.timeout_s;

  DriverSettings settings;
  settings.client = client;
  settings.chat = options.endpoint == "chat";
  settings.path = url->prefix + (settings.chat ? "/v1/chat/completions" : "/v1/completions");
  settings.duration_s = options.duration_s;
  settings.grace_s = options.timeout_s;
  settings.concurrency_limit = options.concurrency_limit;
  for (const auto& [rate, trace] : *traces) {
    const std::vector<PlannedRequest> plan = plan_requests(trace, options, model);
    err << kBenchServe << ": " << (rate ? fixed(*rate, 2) + " req/s" : std::string("trace")) << ", "
        << plan.size() << " requests\n"
        << std::flush;
    const DriverRun run = run_open_loop(plan, settings);
    report.runs.push_back(summarize_run(run, plan, rate));
  }
  if (options.json) {
    out << dump_json(bench_serve_json(report)) << "\n";
  } else {
    print_bench_serve(report, out);
  }
  return kExitOk;
}

}  // namespace kvvm::cli
