// `kvvm bench kv-error`: what an fp8 (e4m3) KV cache costs in accuracy, so users can judge the
// trade. Random prompts (token ids drawn from a seed) are each prefilled twice with one model:
// into a cache of the model's own type (the KV space's default: fp32 on the CPU, the compute
// type on CUDA) and into an fp8 one, with the scales --kv-scales says. The last position's
// logits are compared: per prompt the relative error max_i |fp8_i - ref_i| / max_i |ref_i| (the
// parity tests' measure) and whether the greedy token agrees; mean, median and max over the
// prompts.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "kit/weight_flags.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct BenchKvErrorOptions {
  std::string model_dir;                 // --model DIR (required)
  std::string backend = "auto";          // auto | cpu | cuda
  WeightFlags weights;                   // --weight-budget, --ring-slots, --load-format
  std::string kv_scales = "checkpoint";  // --kv-scales: checkpoint or calibrate
  std::uint32_t prompts = 64;
  std::uint64_t prompt_tokens = 512;
  std::uint64_t seed = 1;
  bool json = false;
};

// Adds `kv-error` under the existing `bench` subcommand.
CLI::App* add_bench_kv_error_command(CLI::App& bench, BenchKvErrorOptions& options);

// The whole subcommand: the report (text or --json) on `out`, progress on `err`; kExitUsage for
// bad options, kExitFailure when a step failed.
int run_bench_kv_error(const BenchKvErrorOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
