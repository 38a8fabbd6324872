// `kvvm simulate` (issues 4 and 6): replays a request trace through the real arena, with admission
// through the governor, beside two baselines computed on the same trace in the same run:
// preallocate (max context per request, what a plain allocator does) and paged-16 (blocks of
// 16 tokens without sharing, vLLM's default accounting). See sim_scheduler.h for the rules
// every system is replayed by, trace.h for the generator and the JSONL format, arena_model.h
// for how kvvm's side uses the arena and shares prefixes, baselines.h for the baselines.
// With the prefix cache (issue 6: --prefix-cache, on by default with --conversations), two
// more systems run on the same trace: kvvm+cache (the arena through PrefixCache, automatic
// detection over token ids) and paged-16+cache (vLLM's automatic prefix caching on blocks of
// 16), each reporting hit rate, hit tokens and the bytes they did not recompute.
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

#include "info_command.h"  // BackendChoice, exit codes
#include "kvvm/status.h"
#include "sim_report.h"
#include "trace.h"

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
  std::string dtype;  // empty: the config's torch_dtype, fp16 for built-ins
  std::string layout = "token-major";
  std::uint64_t budget = std::uint64_t{40} << 30;
  std::uint64_t max_context = 8192;
  std::string trace;                // a JSONL file; empty: the generator
  TraceGeneratorOptions generator;  // its max_context is set from max_context
  ChatGeneratorOptions chat;        // conversations > 0: the multi-turn generator
  // The prefix-cache systems (kvvm+cache, paged-16+cache): "on", "off", or "auto" (on with
  // the multi-turn generator).
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

// Validates, builds the trace (malformed JSONL lines are reported on `err` and skipped),
// opens the driver and replays the trace through kvvm and the two baselines. `progress_err`
// (may be null) receives the progress line. InvalidArgument for options that make no sense;
// the failing call's status otherwise.
Result<SimulateReport> make_simulation(const SimulateOptions& options, std::ostream& err,
                                       std::ostream* progress_err);

// The whole subcommand. kExitOk; kExitSkippedLines when the run finished but trace lines were
// skipped; kExitUsage for a bad request (an unreadable trace, options that make no sense, a
// backend this machine lacks, --plot without gnuplot); kExitFailure when a call failed.
int run_simulate(const SimulateOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
