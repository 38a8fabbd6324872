// What `kvvm simulate` reports, and its renderings: the side-by-side text table, JSON, the
// CSV time series, and the gnuplot figure. Computing lives in simulate_command.cc; this file
// only formats, so the tests check numbers on the report and wording on the text.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/kv/layout.h"
#include "kvvm/vmm/driver.h"
#include "sim/arena_model.h"
#include "sim/replay_scheduler.h"
#include "sim/trace.h"

namespace kvvm::cli {

// The trace as replayed.
struct TraceFigures {
  std::string source;  // "generated (seed N)" or the JSONL path
  std::uint64_t requests = 0;
  std::uint64_t prefix_groups = 0;
  std::uint64_t skipped_lines = 0;
  double mean_prompt_tokens = 0;
  double mean_output_tokens = 0;
  std::uint64_t max_prompt_tokens = 0;
  std::uint64_t max_output_tokens = 0;
  double last_arrival_s = 0;
};

struct SimulateReport {
  DriverInfo driver;
  std::uint64_t granule = 0;
  LayoutPlan plan;
  std::uint64_t requested_budget = 0;
  std::uint64_t budget = 0;  // what ran: requested, or capped to a GPU's free memory
  std::uint64_t max_slots = 0;
  bool sharing = true;
  double step_s = 0;
  double max_queue_wait_s = 0;
  TraceFigures trace;
  // The arithmetic the runs are compared against.
  std::uint64_t preallocate_capacity = 0;  // floor(budget / (max context x bytes per token))
  // One per system, in simulate_command.cc's table order (simulated_systems()): kvvm first.
  std::vector<RunSummary> runs;
  ArenaModelReport kvvm;
  std::optional<ArenaModelReport> kvvm_cache;  // with the prefix-cache systems
  double wall_s = 0;                           // the whole command
};

// {"backend", "device", "model": {...}, "layout", "granule_bytes", "max_context_tokens",
//  "budget_bytes", "requested_budget_bytes", "max_slots", "sharing", "step_s",
//  "max_queue_wait_s", "trace": {...}, "preallocate_capacity",
//  "systems": [{name, requests, admitted, queued, rejected, rejected_too_large, completed,
//               aborted, preemptions, peak_concurrency, mean_concurrency, mean_wait_s,
//               p99_wait_s, steps, simulated_s, peak_committed_bytes, mean_committed_bytes,
//               peak_live_bytes, mean_live_bytes, waste_ratio, peak_used_bytes,
//               peak_saved_bytes, mean_saved_bytes}],
//  "kvvm": {driver_calls: {create, map, set_access, unmap, release, total}, commits,
//           commit_us_p50, commit_us_p99, arena_calls, arena_call_seconds, shared_admissions,
//           publishes, publish_refusals, [publish_refusal_reason], stale_prefixes,
//           refused_budget, refused_slots, grow_refusals, reused_admissions,
//           tier: {limit, peak, refusals, reclaimed}, pool: {pooled_bytes, creates, releases,
//           hits}}, "wall_s"}
nlohmann::ordered_json simulate_json(const SimulateReport& report);

// The human form: what ran, then one table with a column per system.
void print_simulate(const SimulateReport& report, std::ostream& out);

// The time series, one row per simulated step:
// step,time_s,<sys>_running,<sys>_queued,<sys>_committed_bytes,<sys>_live_bytes,
// <sys>_saved_bytes for each system in the report's order, its name without '-' and with '+'
// as '_' (kvvm, paged16_cache, paged16, preallocate, ...; a run that ended earlier repeats
// zeros: nothing runs, nothing is held).
void write_series_csv(const SimulateReport& report, std::ostream& out);

// Upper bound of the log2 histogram bucket holding the q-th percentile, in microseconds; 0
// when empty.
double histogram_percentile_us(const std::vector<std::uint64_t>& buckets, double q);

// Draws concurrency and committed memory over time for every system into `png` with
// `gnuplot` (a program name looked up on PATH, or a path). Unavailable, naming the Debian
// package (gnuplot-nox), when it is not found; Internal with its output when it fails.
Status plot_series(const SimulateReport& report, const std::string& png,
                   const std::string& gnuplot = "gnuplot");

}  // namespace kvvm::cli
