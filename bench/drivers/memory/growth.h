// `kvvm bench growth`: what growing a sequence by one token costs, measured.
//
// Part 1, the growth table: for each model x layout x commit-ahead (0 and N windows per
// fragment), a fresh governor, handle pool and arena; `sequences` sequences are admitted with
// one token and grown one token per step, round-robin, to `tokens`, timing every
// Arena::ensure. Reported per combination: mean / p50 / p99 / max of ensure in nanoseconds,
// how many ensures had to commit, and the driver calls made (create, map, set_access).
//
// Part 2, the decode loop (CUDA backend, built with the CUDA kernels): sequences grow one
// token per step while a spin kernel stands in for a fixed per-step kernel time; the step
// time's p50 / p99 with growth is compared with the same loop over pre-committed memory.
// The goal: p99 with growth and commit-ahead on <= 1.02 x p99 without growth.
//
// Why a fresh governor, pool and arena per combination: every row starts from an empty pool,
// so its driver calls are exactly what the layout arithmetic predicts and rows do not
// inherit each other's pooled handles.
//
// The pieces are separate functions so tests can call them on the host driver:
// run_growth_benchmark measures, bench_growth_json and print_bench_growth render,
// run_bench_growth is the whole subcommand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/drivers/memory/decode_loop.h"
#include "kit/cli_common.h"  // BackendChoice, exit codes
#include "kit/op_timing.h"   // LatencySummary
#include "kvvm/base/status.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/kv/layout.h"
#include "kvvm/vmm/driver.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct BenchGrowthOptions {
  BackendChoice backend = BackendChoice::kAuto;
  int device = 0;                                       // CUDA device ordinal
  std::uint64_t host_granule = std::uint64_t{2} << 20;  // host backend: windows like a GPU's
  std::vector<std::string> models;  // built-in names or config.json paths; empty or "all":
                                    // every built-in geometry
  std::string layout = "all";       // head-major, seq-major, token-major or all
  std::uint64_t tokens = 4096;      // each sequence grows to this (also the max context)
  std::uint32_t sequences = 8;
  std::uint32_t ahead = 2;        // commit-ahead windows per fragment; rows for 0 and this
  std::uint64_t steps = 512;      // timed decode steps (after the warm-up)
  std::uint32_t kernel_us = 200;  // the spin kernel's time per decode step
  bool json = false;
};

// Adds `bench` with its `growth` subcommand to `app`, binding the options to `options` (which
// must outlive the parse); returns the `growth` subcommand. Malformed values throw CLI11's
// parse errors (exit 2 in main).
CLI::App* add_bench_command(CLI::App& app, BenchGrowthOptions& options);

// Driver calls made during one measurement (after the arena reserved its addresses).
struct DriverCallDelta {
  std::uint64_t create = 0;
  std::uint64_t map = 0;
  std::uint64_t set_access = 0;
  std::uint64_t unmap = 0;
  std::uint64_t release = 0;
};

// One model x layout x commit-ahead combination.
struct GrowthRow {
  std::string model;
  Layout layout = Layout::kTokenMajor;
  std::uint32_t ahead_windows = 0;
  std::uint64_t fragments = 0;
  std::uint64_t bytes_per_token = 0;
  std::uint64_t memory_bytes = 0;      // the tier limit: sequences x what one may commit
  std::optional<std::string> skipped;  // why the combination did not run; figures below unset
  std::uint64_t ensures = 0;           // (tokens - 1) x sequences
  std::uint64_t ensures_committing = 0;
  std::uint64_t ahead_commits = 0;
  std::uint64_t committed_bytes = 0;  // at the end
  LatencySummary ensure_ns;           // per ensure = per token of one sequence
  DriverCallDelta driver_calls;       // admissions, growth and commit-ahead together
};

struct BenchGrowthReport {
  DriverInfo driver;
  std::uint64_t granule = 0;
  std::uint64_t tokens = 0;
  std::uint32_t sequences = 0;
  std::uint32_t ahead = 0;
  std::vector<GrowthRow> rows;
  DecodeReport decode;
};

// What `sequences` sequences of `tokens` tokens may commit with `ahead` windows per fragment
// of commit-ahead (never beyond the slot): sequences x fragments x
// min(windows(tokens) + ahead, windows(max context)) x granule. Nullopt past 64 bits.
std::optional<std::uint64_t> bench_memory_bytes(const LayoutPlan& plan, std::uint32_t sequences,
                                                std::uint64_t tokens, std::uint32_t ahead);

// Validates the options (InvalidArgument naming the option), measures every combination on
// `driver` (skipping, with the reason, those whose memory is more than usable), then runs the
// decode loop when `driver` is a CUDA driver and the kernels are built.
Result<BenchGrowthReport> run_growth_benchmark(Driver& driver, const BenchGrowthOptions& options);

// {"benchmark": "growth", "backend", "device": {name, ordinal}, "granule_bytes", "tokens",
//  "sequences", "ahead_windows": [0, N],
//  "growth": [{model, layout, ahead_windows, fragments, bytes_per_token, memory_bytes,
//              skipped, [reason] | [ensures, ensures_committing, ahead_commits,
//              committed_bytes, driver_calls: {create, map, set_access, unmap, release},
//              ensure_ns: {samples, mean, p50, p99, max}]}],
//  "decode_loop": {ran, [reason] | [model, layout, sequences, start_tokens, final_tokens,
//                  warmup_steps, steps, kernel_us, read_bytes,
//                  variants: [{name, growth, ahead_windows, step_us: {...},
//                              ensures_committing, ahead_commits}],
//                  ratios: [{name, value, [goal, met]}]]}}
nlohmann::ordered_json bench_growth_json(const BenchGrowthReport& report);

// The human-readable form: aligned tables, units in the headers.
void print_bench_growth(const BenchGrowthReport& report, std::ostream& out);

// The whole subcommand: results to `out`, errors to `err`. kExitOk; kExitUsage for options
// that make no sense or a backend this machine lacks; kExitFailure when a call failed at run
// time or no combination fit in memory.
int run_bench_growth(const BenchGrowthOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
