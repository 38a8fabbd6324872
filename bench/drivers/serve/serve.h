// `kvvm bench serve --url URL`: a load generator for any OpenAI-compatible server (kvvm serve,
// vLLM, bench/serve_hf.py). It replays a request trace open loop
// (bench/drivers/serve/serve_driver.h) through streamed completions or chat requests
// (bench/drivers/serve/serve_request.h, bench/drivers/serve/serve_client.h) and reports, per
// arrival rate, what came back (bench/drivers/serve/serve_report.h).
//
// The trace is `kvvm simulate`'s generator (sim/trace.h: Poisson arrivals, log-normal lengths,
// tenants whose requests share a system prompt) at each --rates value, or a JSONL trace file
// (--trace) replayed at its own arrival times. The defaults are small (16 requests at 4 per
// second, short prompts and outputs) so a run finishes in about a minute on a CPU.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include "bench/drivers/serve/serve_report.h"
#include "kvvm/base/status.h"
#include "sim/trace.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct BenchServeOptions {
  std::string url;                       // --url (required)
  std::string model;                     // empty: the first id of GET /v1/models
  std::string api_key;                   // sent as "Authorization: Bearer KEY"
  std::string endpoint = "completions";  // or "chat"
  std::string trace_file;                // JSONL; empty: generated
  std::string rates;                     // "1,4,16"; empty: --rate
  double rate = 4;
  std::uint64_t requests = 16;  // per rate
  std::uint32_t tenants = 2;
  std::uint64_t system_prompt_tokens = 32;
  double prompt_mean = 32;  // user prompt tokens, log-normal mean
  double output_mean = 16;  // output tokens, log-normal mean
  std::uint64_t max_context = 4096;
  std::uint64_t seed = 1;
  std::uint32_t vocab = 1000;      // prompt ids in [0, vocab)
  std::uint64_t max_requests = 0;  // 0: the whole trace
  std::optional<double> duration_s;
  double timeout_s = 60;
  std::uint32_t concurrency_limit = 0;
  bool json = false;
};

// Adds `serve` under the existing `bench` subcommand.
CLI::App* add_bench_serve_command(CLI::App& bench, BenchServeOptions& options);

// The whole subcommand: the report (a table, or --json) on `out`, progress and errors on `err`.
// kExitOk once every rate ran (429s and errors are results, not failures); kExitUsage for bad
// options or trace; kExitFailure when the server cannot be reached at the start or names no
// model.
int run_bench_serve(const BenchServeOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
