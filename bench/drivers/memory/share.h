// `kvvm bench share`: what prefix sharing saves and what its copies cost, measured on
// this machine's driver through the real arena.
//
// Part 1, savings: one sequence writes a prefix of `prefix` tokens and publishes it; `sequences`
// - 1 more are admitted sharing it, each with `extra` private tokens. Reported: committed
// (every mapping), physical (each handle once), saved, and the prediction (sharers x the
// prefix's whole windows), with whether they agree.
//
// Part 2, costs per granule, with pooled handles (the pool is warmed first, so no create):
//   boundary copy   admit_shared with a prefix whose partial window holds almost a granule,
//                   minus the same admission with a prefix ending on a window boundary;
//   copy-on-write   ensure() that writes one token into a shared window after a rewind
//                   (fresh handle mapped, granule copied on the stream and waited for,
//                   remapped), per fragment;
//   in place        the same when no one else maps the window (access change only).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "kit/cli_common.h"  // BackendChoice, exit codes
#include "kit/op_timing.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct BenchShareOptions {
  BackendChoice backend = BackendChoice::kAuto;
  int device = 0;
  std::uint64_t host_granule = std::uint64_t{2} << 20;
  std::string model = "qwen2.5-14b";
  std::string layout = "token-major";
  std::uint64_t prefix = 2048;     // shared prefix tokens
  std::uint64_t extra = 256;       // private tokens per sequence
  std::uint32_t sequences = 8;     // the publisher included
  std::uint32_t repetitions = 64;  // timed samples per cost
  bool json = false;
};

struct ShareSavings {
  std::string model;
  std::string layout;
  std::uint64_t granule = 0;
  std::uint64_t prefix_tokens = 0;
  std::uint32_t sequences = 0;
  std::uint64_t shared_windows = 0;  // per fragment
  std::uint64_t committed_bytes = 0;
  std::uint64_t physical_bytes = 0;
  std::uint64_t saved_bytes = 0;
  std::uint64_t predicted_saved_bytes = 0;  // (sequences - 1) x the prefix's whole windows
  std::uint64_t boundary_bytes = 0;         // per sharer
};

struct ShareCosts {
  TimingSummary admit_with_boundary;     // µs per admission
  TimingSummary admit_without_boundary;  // µs per admission
  std::uint64_t boundary_bytes = 0;      // copied per admission with boundary
  TimingSummary copy_on_write;           // µs per window (all fragments)
  TimingSummary in_place;                // µs per window
  TimingSummary granule_copy;            // the driver's copy of one granule + fence wait
  std::uint64_t in_place_copies = 0;     // copies made during the in-place runs: 0 expected
  std::uint64_t fragments = 0;
};

struct ShareReport {
  std::string backend;
  std::string device;
  ShareSavings savings;
  ShareCosts costs;
};

CLI::App* add_bench_share_command(CLI::App& bench, BenchShareOptions& options);
nlohmann::json bench_share_json(const ShareReport& report);
void print_bench_share(const ShareReport& report, std::ostream& out);
int run_bench_share(const BenchShareOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
