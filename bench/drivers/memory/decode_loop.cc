// The decode loop of `kvvm bench growth` (bench/drivers/memory/decode_loop.h): sequences grow one
// token per step while a kernel stands in for the step's attention work, so the step time says what
// growth costs a decoding engine, not what it costs in isolation.
//
// One step: launch the kernel (reading slot 0's first window); ensure(+1 token) for every
// sequence while it runs, as a scheduler prepares the next step; wait for the kernel.
// Without commit-ahead an ensure that crosses a window boundary maps on the critical path;
// with it the worker has mapped the window during earlier steps.
#include "bench/drivers/memory/decode_loop.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/drivers/memory/growth.h"  // BenchGrowthOptions, bench_memory_bytes
#include "kit/byte_size.h"
#include "kit/text_table.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/arena_stack.h"

#if defined(KVVM_HAS_CUDA_KERNELS)
#include "kernels/spin_reader.h"
#endif

namespace kvvm::cli {
namespace {

struct VariantSpec {
  std::string name;
  bool growth = false;
  std::uint32_t ahead = 0;
};

// Waits for the kernel launched last whichever way run_variant returns, before the arena
// (declared earlier) is torn down: nothing is unmapped under a running kernel.
class Drain {
 public:
  explicit Drain(const StepKernel& kernel) : kernel_(kernel) {}
  Drain(const Drain&) = delete;
  Drain& operator=(const Drain&) = delete;
  ~Drain() {
    if (pending_) kernel_.wait().ignore();
  }
  void launched() { pending_ = true; }
  void waited() { pending_ = false; }

 private:
  const StepKernel& kernel_;
  bool pending_ = false;
};

// One variant with its own governor, pool and arena (torn down in reverse order).
Result<DecodeVariant> run_variant(Driver& driver, const LayoutPlan& plan,
                                  const BenchGrowthOptions& options, const DecodeReport& shape,
                                  const VariantSpec& spec, const StepKernel& kernel) {
  const std::string what = spec.name + " (ahead " + str(spec.ahead) + ")";
  const std::optional<std::uint64_t> needed =
      bench_memory_bytes(plan, options.sequences, shape.final_tokens, spec.ahead);
  const DriverInfo info = driver.info();
  const std::uint64_t usable = usable_memory(info);
  if (!needed || *needed > usable) {
    return Status::ResourceExhausted(
        what + ": needs " + (needed ? format_bytes(*needed) : std::string("over 2^64 B")) +
            " for " + str(options.sequences) + " sequences of " + str(shape.final_tokens) +
            " tokens; " + format_bytes(usable) + " usable of " + format_bytes(info.free_bytes) +
            " free",
        Exhaustion{needed.value_or(0), usable, info.total_bytes});
  }
  Result<std::unique_ptr<ArenaStack>> created = ArenaStack::create(
      driver, ArenaStackOptions{.tier_name = "bench decode",
                                .budget_bytes = *needed,
                                .arena = ArenaOptions{.plan = plan,
                                                      .max_slots = options.sequences,
                                                      .commit_ahead_windows = spec.ahead}});
  if (!created.ok()) return created.status().with_context(what);
  Arena& arena = (*created)->arena();

  std::vector<SlotId> slots;
  for (std::uint32_t s = 0; s < options.sequences; ++s) {
    Result<SlotId> slot = arena.admit(shape.start_tokens);
    if (!slot.ok()) return slot.status().with_context(what + ": admitting sequence " + str(s + 1));
    slots.push_back(*slot);
  }
  if (!spec.growth) {  // every window the loop will touch mapped before it starts
    for (SlotId slot : slots) {
      Status committed = arena.ensure(slot, shape.final_tokens);
      if (!committed.ok()) return committed.with_context(what + ": pre-committing");
    }
  }
  const std::uint64_t address = arena.slot_base(slots.front());
  Drain drain(kernel);

  std::vector<double> step_us;
  step_us.reserve(shape.steps);
  ArenaStats at_warm = arena.stats();
  std::uint64_t tokens = shape.start_tokens;
  for (std::uint64_t step = 0; step < shape.warmup_steps + shape.steps; ++step) {
    if (step == shape.warmup_steps) at_warm = arena.stats();
    const std::string at = what + ", step " + str(step + 1);
    const auto start = std::chrono::steady_clock::now();
    Status launched = kernel.launch(address, shape.read_bytes, options.kernel_us);
    if (!launched.ok()) return launched.with_context(at + ": launching the kernel");
    drain.launched();
    for (SlotId slot : slots) {
      Status grown = arena.ensure(slot, tokens + 1);
      if (!grown.ok()) return grown.with_context(at);
    }
    Status waited = kernel.wait();
    const auto stop = std::chrono::steady_clock::now();
    drain.waited();
    if (!waited.ok()) return waited.with_context(at + ": waiting for the kernel");
    ++tokens;
    if (step >= shape.warmup_steps) {
      step_us.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
    }
  }
  const ArenaStats at_end = arena.stats();
  DecodeVariant variant;
  variant.name = spec.name;
  variant.growth = spec.growth;
  variant.ahead_windows = spec.ahead;
  variant.step_us = summarize_latency(step_us);
  variant.ensures_committing = at_end.ensures_committing - at_warm.ensures_committing;
  variant.ahead_commits = at_end.ahead_commits - at_warm.ahead_commits;
  return variant;
}

}  // namespace

Result<DecodeReport> run_decode_loop_with(Driver& driver, const Geometry& geometry, Layout layout,
                                          const BenchGrowthOptions& options,
                                          const StepKernel& kernel) {
  DecodeReport report;
  report.ran = true;
  report.model = geometry.name;
  report.layout = layout;
  report.sequences = options.sequences;
  report.start_tokens = 1;
  report.warmup_steps = kDecodeWarmupSteps;
  report.steps = options.steps;
  report.final_tokens = report.start_tokens + report.warmup_steps + report.steps;
  report.kernel_us = options.kernel_us;
  // The slot holds the whole loop even when --tokens is shorter than it.
  const std::uint64_t max_context = std::max(options.tokens, report.final_tokens);
  Result<LayoutPlan> plan = plan_layout(geometry, layout, driver.granule(), max_context);
  if (!plan.ok()) return plan.status().with_context(geometry.name);
  report.read_bytes = plan->granule;  // window 0 of fragment 0: committed from admission

  const std::vector<VariantSpec> specs = {
      {"no growth", false, 0}, {"growth", true, 0}, {"growth", true, options.ahead}};
  for (const VariantSpec& spec : specs) {
    KVVM_ASSIGN_OR_RETURN(DecodeVariant variant,
                          run_variant(driver, *plan, options, report, spec, kernel));
    report.variants.push_back(std::move(variant));
  }
  const double base = report.variants[0].step_us.p99;
  const auto ratio_of = [&](const DecodeVariant& v) { return base > 0 ? v.step_us.p99 / base : 0; };
  DecodeRatio ahead_ratio{"p99 growth ahead=" + str(options.ahead) + " / p99 no growth",
                          ratio_of(report.variants[2]), kDecodeP99Goal, false};
  ahead_ratio.met = base > 0 && ahead_ratio.value <= kDecodeP99Goal;
  report.ratios.push_back(ahead_ratio);
  report.ratios.push_back(DecodeRatio{"p99 growth ahead=0 / p99 no growth",
                                      ratio_of(report.variants[1]), std::nullopt, false});
  return report;
}

#if defined(KVVM_HAS_CUDA_KERNELS)

bool decode_loop_built() { return true; }

Result<DecodeReport> run_decode_loop(Driver& driver, const Geometry& geometry, Layout layout,
                                     const BenchGrowthOptions& options) {
  // The driver makes its device's primary context current on this thread (every call does);
  // the runtime the kernel kit uses then runs on that same context.
  (void)driver.info();
  Result<void*> created = kernels::create_stream();
  if (!created.ok()) return created.status().with_context("creating the kernel's stream");
  struct StreamHolder {
    void* stream;
    ~StreamHolder() {
      kernels::synchronize_stream(stream).ignore();
      kernels::destroy_stream(stream);
    }
  } holder{*created};
  void* const stream = holder.stream;
  const StepKernel kernel{
      [stream](std::uint64_t address, std::uint64_t bytes, std::uint32_t microseconds) {
        return kernels::launch_spin_reader(stream, address, bytes, microseconds, 0);
      },
      [stream] { return kernels::synchronize_stream(stream); }};
  return run_decode_loop_with(driver, geometry, layout, options, kernel);
}

#else  // built without the CUDA kernels

bool decode_loop_built() { return false; }

Result<DecodeReport> run_decode_loop(Driver& /*driver*/, const Geometry& /*geometry*/,
                                     Layout /*layout*/, const BenchGrowthOptions& /*options*/) {
  return Status::Unavailable(std::string("decode loop: ") + kDecodeNeedsKernels);
}

#endif

}  // namespace kvvm::cli
