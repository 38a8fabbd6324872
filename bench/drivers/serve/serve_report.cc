#include "bench/drivers/serve/serve_report.h"

#include <algorithm>
#include <ostream>
#include <set>

#include "kit/text_table.h"

namespace kvvm::cli {
namespace {

constexpr std::size_t kMaxErrorExamples = 5;

std::optional<LatencySummary> summary_of(const std::vector<double>& samples) {
  if (samples.empty()) return std::nullopt;
  return summarize_latency(samples);
}

nlohmann::ordered_json latency_json(const std::optional<LatencySummary>& summary) {
  if (!summary) return nullptr;
  return {{"samples", summary->samples},
          {"mean", summary->mean},
          {"p50", summary->p50},
          {"p99", summary->p99},
          {"max", summary->max}};
}

std::string ms(const std::optional<LatencySummary>& summary, bool p99) {
  if (!summary) return "-";
  return fixed(p99 ? summary->p99 : summary->p50, 1);
}

std::string rate_text(const RateReport& run) {
  return run.rate ? fixed(*run.rate, 2) : std::string("trace");
}

}  // namespace

std::uint64_t error_count(const RateReport& report) {
  std::uint64_t total = report.connection_errors + report.stream_errors;
  for (const auto& [status, count] : report.errors_by_status) total += count;
  return total;
}

RateReport summarize_run(const DriverRun& run, const std::vector<PlannedRequest>& plan,
                         std::optional<double> rate) {
  RateReport report;
  report.rate = rate;
  report.planned = plan.size();
  std::vector<double> retry_after, ttft, tpot, e2e;
  std::set<std::string> seen_kinds;
  double first_issue = 0, last_completion = 0;
  bool any_sent = false, any_completed = false;
  for (std::size_t i = 0; i < run.requests.size() && i < plan.size(); ++i) {
    const IssuedRequest& request = run.requests[i];
    if (!request.sent) {
      ++report.not_sent;
      continue;
    }
    ++report.sent;
    first_issue = any_sent ? std::min(first_issue, request.issued_s) : request.issued_s;
    any_sent = true;
    report.max_issue_lag_ms =
        std::max(report.max_issue_lag_ms, (request.issued_s - plan[i].arrival_s) * 1e3);
    const StreamOutcome& outcome = request.outcome;
    switch (outcome.kind) {
      case OutcomeKind::kCompleted: {
        ++report.completed;
        report.output_tokens += outcome.output_tokens;
        report.prompt_tokens += outcome.prompt_tokens;
        if (!outcome.usage) ++report.without_usage;
        last_completion =
            any_completed ? std::max(last_completion, request.ended_s) : request.ended_s;
        any_completed = true;
        e2e.push_back((request.ended_s - request.issued_s) * 1e3);
        if (request.ttft_s) ttft.push_back(*request.ttft_s * 1e3);
        if (request.ttft_s && request.last_token_s && outcome.output_tokens >= 2) {
          tpot.push_back((*request.last_token_s - *request.ttft_s) * 1e3 /
                         static_cast<double>(outcome.output_tokens - 1));
        }
        break;
      }
      case OutcomeKind::kRejected:
        ++report.rejected_429;
        retry_after.push_back(outcome.retry_after_s.value_or(0));
        break;
      case OutcomeKind::kHttpError:
        ++report.errors_by_status[outcome.status];
        break;
      case OutcomeKind::kConnection:
        ++report.connection_errors;
        break;
      case OutcomeKind::kStream:
        ++report.stream_errors;
        break;
      case OutcomeKind::kCancelled:
        ++report.cancelled;
        break;
    }
    const bool failed = outcome.kind != OutcomeKind::kCompleted &&
                        outcome.kind != OutcomeKind::kRejected &&
                        outcome.kind != OutcomeKind::kCancelled;
    const std::string kind = std::string(to_string(outcome.kind)) + std::to_string(outcome.status);
    if (failed && report.error_examples.size() < kMaxErrorExamples &&
        seen_kinds.insert(kind).second) {
      report.error_examples.push_back(outcome.error);
    }
  }
  if (!retry_after.empty()) {
    const LatencySummary summary = summarize_latency(retry_after);
    report.retry_after = RetryAfterSummary{
        *std::min_element(retry_after.begin(), retry_after.end()), summary.p50, summary.max};
  }
  if (any_completed) {
    report.wall_s = last_completion - first_issue;
    report.output_tokens_per_s =
        report.wall_s > 0 ? static_cast<double>(report.output_tokens) / report.wall_s : 0;
  }
  report.ttft_ms = summary_of(ttft);
  report.tpot_ms = summary_of(tpot);
  report.e2e_ms = summary_of(e2e);
  return report;
}

nlohmann::ordered_json bench_serve_json(const BenchServeReport& report) {
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  for (const RateReport& run : report.runs) {
    nlohmann::ordered_json by_status = nlohmann::ordered_json::object();
    for (const auto& [status, count] : run.errors_by_status) {
      by_status[std::to_string(status)] = count;
    }
    nlohmann::ordered_json retry = nullptr;
    if (run.retry_after) {
      retry = {{"min", run.retry_after->min},
               {"median", run.retry_after->median},
               {"max", run.retry_after->max}};
    }
    runs.push_back({{"rate", run.rate ? nlohmann::ordered_json(*run.rate) : nullptr},
                    {"planned", run.planned},
                    {"sent", run.sent},
                    {"not_sent", run.not_sent},
                    {"completed", run.completed},
                    {"rejected_429", run.rejected_429},
                    {"retry_after_s", retry},
                    {"errors",
                     {{"total", error_count(run)},
                      {"by_status", by_status},
                      {"connection", run.connection_errors},
                      {"stream", run.stream_errors}}},
                    {"cancelled", run.cancelled},
                    {"output_tokens", run.output_tokens},
                    {"prompt_tokens", run.prompt_tokens},
                    {"without_usage", run.without_usage},
                    {"wall_s", run.wall_s},
                    {"output_tokens_per_s", run.output_tokens_per_s},
                    {"ttft_ms", latency_json(run.ttft_ms)},
                    {"tpot_ms", latency_json(run.tpot_ms)},
                    {"e2e_ms", latency_json(run.e2e_ms)},
                    {"max_issue_lag_ms", run.max_issue_lag_ms},
                    {"error_examples", run.error_examples}});
  }
  return {{"benchmark", "serve"},
          {"url", report.url},
          {"model", report.model},
          {"endpoint", report.endpoint},
          {"trace", report.trace},
          {"concurrency_limit", report.concurrency_limit},
          {"duration_s", report.duration_s ? nlohmann::ordered_json(*report.duration_s) : nullptr},
          {"timeout_s", report.timeout_s},
          {"runs", std::move(runs)}};
}

void print_bench_serve(const BenchServeReport& report, std::ostream& out) {
  out << "kvvm bench serve: " << report.url << ", model " << report.model << ", " << report.endpoint
      << " endpoint, " << report.trace << " trace"
      << (report.concurrency_limit > 0 ? ", at most " + str(report.concurrency_limit) + " in flight"
                                       : std::string(", open loop"))
      << "\n\n";
  TextTable table(
      {"rate req/s", "sent", "done", "429", "errors", "cancelled", "out tok/s", "TTFT p50 ms",
       "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "E2E p50 ms", "E2E p99 ms"},
      1);
  for (const RateReport& run : report.runs) {
    table.add({rate_text(run), str(run.sent), str(run.completed), str(run.rejected_429),
               str(error_count(run)), str(run.cancelled), fixed(run.output_tokens_per_s, 1),
               ms(run.ttft_ms, false), ms(run.ttft_ms, true), ms(run.tpot_ms, false),
               ms(run.tpot_ms, true), ms(run.e2e_ms, false), ms(run.e2e_ms, true)});
  }
  table.print(out);
  for (const RateReport& run : report.runs) {
    const std::string at = "rate " + rate_text(run) + ": ";
    if (run.not_sent > 0) {
      out << at << run.not_sent << " of " << run.planned
          << " requests not sent (--duration ended first)\n";
    }
    if (run.retry_after) {
      out << at << run.rejected_429 << " x 429, Retry-After min " << fixed(run.retry_after->min, 1)
          << " s, median " << fixed(run.retry_after->median, 1) << " s, max "
          << fixed(run.retry_after->max, 1) << " s\n";
    }
    if (error_count(run) > 0) {
      out << at << "errors:";
      for (const auto& [status, count] : run.errors_by_status) {
        out << " HTTP " << status << " x " << count << ";";
      }
      if (run.connection_errors > 0) out << " connection x " << run.connection_errors << ";";
      if (run.stream_errors > 0) out << " stream x " << run.stream_errors << ";";
      out << "\n";
      for (const std::string& example : run.error_examples) out << "  " << example << "\n";
    }
    if (run.without_usage > 0) {
      out << at << run.without_usage
          << " completed without a usage chunk (output tokens counted as content chunks)\n";
    }
  }
}

}  // namespace kvvm::cli
