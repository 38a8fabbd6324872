// Part 2 of `kvvm bench growth` (bench/drivers/memory/growth.h): the decode loop. Sequences grow
// one token per step while a spin kernel stands in for a fixed per-step kernel time; the step
// time's p50 / p99 with growth is compared with the same loop over pre-committed memory. The goal:
// p99 with growth and commit-ahead on <= 1.02 x p99 without growth.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kit/op_timing.h"  // LatencySummary
#include "kvvm/base/status.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/kv/layout.h"
#include "kvvm/vmm/driver.h"

namespace kvvm::cli {

struct BenchGrowthOptions;  // bench/drivers/memory/growth.h

inline constexpr double kDecodeP99Goal = 1.02;
inline constexpr std::uint64_t kDecodeWarmupSteps = 32;
inline constexpr const char* kDecodeNeedsKernels =
    "needs the CUDA kernels (built without nvcc or no GPU)";

struct DecodeVariant {
  std::string name;  // "no growth", "growth"
  bool growth = false;
  std::uint32_t ahead_windows = 0;
  LatencySummary step_us;
  std::uint64_t ensures_committing = 0;  // during the timed steps
  std::uint64_t ahead_commits = 0;       // during the timed steps
};

// p99 of a variant over p99 of "no growth"; `goal` only for the variant that has a target.
struct DecodeRatio {
  std::string name;
  double value = 0;
  std::optional<double> goal;
  bool met = false;
};

struct DecodeReport {
  bool ran = false;
  std::string reason;  // why it did not run
  std::string model;
  Layout layout = Layout::kTokenMajor;
  std::uint32_t sequences = 0;
  std::uint64_t start_tokens = 0;
  std::uint64_t final_tokens = 0;  // start + warm-up + steps
  std::uint64_t warmup_steps = 0;
  std::uint64_t steps = 0;
  std::uint32_t kernel_us = 0;
  std::uint64_t read_bytes = 0;         // what the kernel reads each step (slot 0's first window)
  std::vector<DecodeVariant> variants;  // no growth, growth ahead 0, growth ahead N
  std::vector<DecodeRatio> ratios;      // ahead N (with the goal), then ahead 0
};

// Whether this build has the decode loop's kernel (KVVM_HAS_CUDA_KERNELS).
bool decode_loop_built();

// What a decode step runs besides the ensures: `launch` starts reading [address, address +
// bytes) for `microseconds` without waiting; `wait` returns once it finished. On the GPU the
// spin kernel on a stream; a test can pass a stand-in to run the loop on the host.
struct StepKernel {
  std::function<Status(std::uint64_t address, std::uint64_t bytes, std::uint32_t microseconds)>
      launch;
  std::function<Status()> wait;
};

// The decode loop on `driver` for `geometry` in `layout`, as described at the top, with
// `kernel` as the step's work. ResourceExhausted when a variant's memory is more than
// usable_memory; any failing call's status otherwise (no figure from a failed run).
Result<DecodeReport> run_decode_loop_with(Driver& driver, const Geometry& geometry, Layout layout,
                                          const BenchGrowthOptions& options,
                                          const StepKernel& kernel);

// The same with the spin kernel on a fresh stream of `driver`'s device (a CUDA driver).
// Unavailable (kDecodeNeedsKernels) when built without the kernels.
Result<DecodeReport> run_decode_loop(Driver& driver, const Geometry& geometry, Layout layout,
                                     const BenchGrowthOptions& options);

}  // namespace kvvm::cli
