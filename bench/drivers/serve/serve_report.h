// What `kvvm bench serve` reports for each rate: counts by outcome, 429s with their
// Retry-After values, errors by HTTP status, output tokens/s, and TTFT / TPOT / end-to-end
// latency percentiles, as a text table or JSON.
//
// Definitions: output tokens/s = the completed requests' output tokens (from usage) over the
// wall time from the first issue to the last completion. TTFT = first content chunk - issue;
// TPOT = (last content chunk - first) / (output tokens - 1), for completed requests with at
// least 2 output tokens; end-to-end = the response's end - issue, for completed requests.
// A 429 with a valid Retry-After is a rejection (the server shedding load as asked), not an
// error; a 429 without one is an error under its status.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/drivers/serve/serve_driver.h"
#include "kit/op_timing.h"  // LatencySummary

namespace kvvm::cli {

struct RetryAfterSummary {
  double min = 0, median = 0, max = 0;  // seconds
};

struct RateReport {
  std::optional<double> rate;  // requests/s; nullopt for a --trace file
  std::uint64_t planned = 0;   // requests in the trace
  std::uint64_t sent = 0;
  std::uint64_t not_sent = 0;  // --duration ended before their arrival (or a free slot)
  std::uint64_t completed = 0;
  std::uint64_t rejected_429 = 0;  // with a valid Retry-After
  std::optional<RetryAfterSummary> retry_after;
  std::map<int, std::uint64_t> errors_by_status;  // HTTP errors, 429s without Retry-After too
  std::uint64_t connection_errors = 0;
  std::uint64_t stream_errors = 0;
  std::uint64_t cancelled = 0;      // still in flight after --duration's grace
  std::uint64_t output_tokens = 0;  // completed requests'
  std::uint64_t prompt_tokens = 0;  // completed requests', from usage
  std::uint64_t without_usage = 0;  // completed without a usage chunk (chunks counted)
  double wall_s = 0;                // first issue to last completion
  double output_tokens_per_s = 0;
  std::optional<LatencySummary> ttft_ms, tpot_ms, e2e_ms;
  double max_issue_lag_ms = 0;  // issue - arrival, the worst (a concurrency limit shows here)
  std::vector<std::string> error_examples;  // one message per kind of failure, a few
};

// errors = HTTP errors + connection + stream errors (cancelled requests are counted apart).
std::uint64_t error_count(const RateReport& report);

struct BenchServeReport {
  std::string url;
  std::string model;
  std::string endpoint;  // "completions" or "chat"
  std::string trace;     // "generated" or the file
  std::uint32_t concurrency_limit = 0;
  std::optional<double> duration_s;
  double timeout_s = 0;
  std::vector<RateReport> runs;
};

// Summarizes one run of `plan`; `rate` is recorded as given.
RateReport summarize_run(const DriverRun& run, const std::vector<PlannedRequest>& plan,
                         std::optional<double> rate);

// {"benchmark": "serve", "url", "model", "endpoint", "trace", "concurrency_limit",
//  "duration_s" (null: none), "timeout_s",
//  "runs": [{"rate" (null for a trace file), "planned", "sent", "not_sent", "completed",
//            "rejected_429", "retry_after_s": {min, median, max} | null,
//            "errors": {"total", "by_status": {"503": n}, "connection", "stream"}, "cancelled",
//            "output_tokens", "prompt_tokens", "without_usage", "wall_s",
//            "output_tokens_per_s", "ttft_ms" / "tpot_ms" / "e2e_ms": {samples, mean, p50,
//            p99, max} | null, "max_issue_lag_ms", "error_examples": [...]}]}
nlohmann::ordered_json bench_serve_json(const BenchServeReport& report);

// One table row per rate, then the 429s' Retry-After and the errors of each rate.
void print_bench_serve(const BenchServeReport& report, std::ostream& out);

}  // namespace kvvm::cli
