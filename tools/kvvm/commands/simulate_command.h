// `kvvm simulate`: replays a request trace through the real arena, with admission through the
// governor, beside baselines computed on the same trace in the same run: paged-16+cache (blocks
// of 16 tokens with vLLM's automatic prefix caching, which vLLM turns on by default: a vLLM
// user's baseline), paged-16 (the same blocks without prefix caching) and preallocate (max
// context per request, what a plain allocator does). See sim/replay_scheduler.h for the rules every
// system is replayed by, sim/trace.h for the generator and the JSONL format, sim/arena_model.h for
// how kvvm's side uses the arena and shares prefixes, sim/baselines.h for the baselines. kvvm+cache
// (the arena through PrefixCache, automatic detection over token ids) runs too with
// --prefix-cache on, and by default with --conversations. The prefix-cache systems report hit
// rate, hit tokens and the bytes they did not recompute. The systems are one table in
// simulate_command.cc (name, how to build its memory model, whether it needs the driver and
// token ids): adding a system is adding a row.
//
// Backend: CUDA when a GPU is usable (the budget is capped to its free memory, with a note),
// the host driver otherwise or with --backend host. On the host the handles are sized but not
// populated (the simulation never writes KV bytes), so a 40 GiB budget replays on a machine
// with less memory; its handles share a few large memory files, so the budget is not bound by
// the descriptor limit.
//
// The pieces are separate functions so the tests call them directly: make_simulation runs
// everything and returns the report, run_simulate is the whole subcommand (rendering, --csv,
// --plot, exit status).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "kit/cli_common.h"  // BackendChoice, exit codes
#include "kvvm/base/status.h"
#include "sim/report.h"
#include "sim/trace.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

// The run finished and reported, but some trace lines were malformed and skipped.
inline constexpr int kExitSkippedLines = 3;

struct SimulateOptions {
  BackendChoice backend = BackendChoice::kAuto;
  int device = 0;
  std::uint64_t host_granule = std::uint64_t{2} << 20;  // windows like a GPU's
  std::string model = "llama-3-8b";
  std::string dtype;  // --kv-dtype; empty: the config's torch_dtype, fp16 for built-ins
  std::string layout = "token-major";
  std::uint64_t budget = std::uint64_t{40} << 30;
  std::uint64_t max_context = 8192;
  std::string trace;                // a JSONL file; empty: the generator
  TraceGeneratorOptions generator;  // its max_context is set from max_context
  ChatGeneratorOptions chat;        // conversations > 0: the multi-turn generator
  // The prefix-cache systems: "on" (kvvm+cache and paged-16+cache), "off" (neither), or
  // "auto" (paged-16+cache; kvvm+cache too with the multi-turn generator).
  std::string prefix_cache = "auto";
  double step_ms = 50;
  double max_queue_wait_s = 30;
  bool sharing = true;
  std::uint32_t commit_ahead = 0;
  std::uint64_t pool_bytes = std::uint64_t{256} << 20;
  std::uint32_t max_slots = 0;  // 0: enough for the trace
  bool json = false;
  std::string csv;                  // time series to this file ("-": stdout)
  std::string plot;                 // PNG of the time series (gnuplot)
  std::string save_trace;           // the replayed trace as JSONL
  bool progress = false;            // also when stderr is not a terminal
  std::string gnuplot = "gnuplot";  // the program --plot runs (tests point it elsewhere)
};

CLI::App* add_simulate_command(CLI::App& app, SimulateOptions& options);

// The systems make_simulation replays for these options, in the report's order (kvvm first).
std::vector<std::string> simulated_systems(const SimulateOptions& options);

// Validates, builds the trace (malformed JSONL lines are reported on `err` and skipped),
// opens the driver and replays the trace through every system of simulated_systems().
// `progress_err` (may be null) receives the progress line. InvalidArgument for options that make no
// sense; the failing call's status otherwise.
Result<SimulateReport> make_simulation(const SimulateOptions& options, std::ostream& err,
                                       std::ostream* progress_err);

// The whole subcommand. kExitOk; kExitSkippedLines when the run finished but trace lines were
// skipped; kExitUsage for a bad request (an unreadable trace, options that make no sense, a
// backend this machine lacks, --plot without gnuplot); kExitFailure when a call failed.
int run_simulate(const SimulateOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
