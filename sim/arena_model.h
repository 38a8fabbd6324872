// kvvm's side of `kvvm simulate`: the scheduler's memory model over a real Arena (on the CUDA
// or host driver), with admission through a Governor tier whose limit is the budget.
//
// Why the real arena and not its arithmetic: the simulation is meant to show what kvvm does,
// rounding, pooling, reclaim, sharing and driver calls included, so the figures it reports
// are the arena's own counters. The simulation never writes KV bytes (on the host, handles
// are sized but not populated, so a 40 GiB budget replays on a smaller machine).
//
// Sharing (all of it in admit_with_prefix): requests of one prefix group share its prefix.
// The first admitted one is admitted plainly and publishes its first P tokens; later ones are
// admitted with Arena::admit_shared. When the published prefix is no longer usable (every
// user is gone) or publishing is refused (FailedPrecondition: no whole window inside the
// prefix), the request falls back to a plain admission and the next one publishes again.
//
// Prefix cache (prefix_cache option, "kvvm+cache"): every admission goes through
// PrefixCache::admit with the request's ids (prompt, plus the tokens generated before a
// preemption) and salt; after prefill, and after each growth, extend() and written() publish
// every completed window, generated ones included (vLLM caches generated full blocks too).
// The cache is a reclaimer on the tier, so cached windows no sequence maps are evicted before
// any admission is refused.
//
// Budget: the governor tier's limit. Arena options: budget_wait 0 (never block: a short
// budget is "no room", and the scheduler queues), commit_ahead_windows as asked (default 0, so
// committed bytes are exactly the layout arithmetic's). The handle pool keeps at most
// pool_bytes of unmapped handles; they stay charged to the tier (they are memory) but the
// pool gives them back when a grant is short, before anything is refused.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/arena_stack.h"
#include "kvvm/kv/layout.h"
#include "kvvm/kv/prefix/prefix_cache.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "sim/replay_scheduler.h"

namespace kvvm::cli {

struct ArenaModelOptions {
  LayoutPlan plan;  // its granule must be the driver's
  std::uint64_t budget = 0;
  std::uint32_t max_slots = 0;
  bool sharing = true;
  std::uint64_t pool_bytes = std::uint64_t{256} << 20;
  std::uint32_t commit_ahead_windows = 0;
  // Admit through a PrefixCache (automatic detection over token ids, "kvvm+cache") instead of
  // the trace's declared prefix groups; `sharing` is then ignored.
  bool prefix_cache = false;
};

// What the arena model adds to the scheduler's summary.
struct ArenaModelReport {
  ArenaStats arena;  // at the end of the run
  TierStats tier;
  PoolSnapshot pool;
  DriverCallCounts calls;            // made during the run (after the arena reserved its addresses)
  std::uint64_t refused_budget = 0;  // admissions refused for budget (ResourceExhausted)
  std::uint64_t refused_slots = 0;   // ... for slots (Unavailable: every slot taken)
  std::uint64_t grow_refusals = 0;   // growth refused for budget (the scheduler preempted)
  std::uint64_t shared_admissions = 0;
  std::uint64_t publishes = 0;
  std::uint64_t publish_refusals = 0;  // FailedPrecondition: the prefix is not shareable
  std::string publish_refusal_reason;  // the first one, in the arena's words
  std::uint64_t stale_prefixes = 0;    // a prefix found unusable (all users gone): published again
  std::uint64_t arena_calls = 0;       // admit, admit_shared, publish, ensure, release
  double arena_call_seconds = 0;       // wall time inside those calls
};

class ArenaModel final : public MemoryModel {
 public:
  // InvalidArgument / DriverError from Arena::create (addresses short, granule mismatch).
  static Result<std::unique_ptr<ArenaModel>> create(Driver& driver, ArenaModelOptions options);
  ~ArenaModel() override;

  std::string name() const override { return cache_ ? "kvvm+cache" : "kvvm"; }
  Result<bool> admit(std::size_t seq, const TraceRequest& request, std::uint64_t tokens) override;
  Result<bool> grow(std::size_t seq, std::uint64_t tokens) override;
  Status release(std::size_t seq) override;
  MemorySample sample() const override;
  CacheFigures cache() const override;

  ArenaModelReport report() const;

 private:
  ArenaModel(Driver& driver, ArenaModelOptions options);
  // Admits with the request's prefix group when sharing is on; see the top of the file.
  Result<SlotId> admit_with_prefix(const TraceRequest& request, std::uint64_t tokens);
  // Runs `call`, adding its wall time to the report.
  template <typename Call>
  auto timed(Call&& call) -> decltype(call());

  Driver& driver_;
  const ArenaModelOptions options_;
  DriverCallCounts calls_before_;
  // Destroyed in reverse: the cache and the prefixes before the stack (arena, pool, governor).
  std::unique_ptr<ArenaStack> stack_;
  Arena& arena() { return stack_->arena(); }
  const Arena& arena() const { return stack_->arena(); }
  std::map<std::pair<int, std::uint64_t>, std::shared_ptr<SharedPrefix>> prefixes_;
  std::unordered_map<std::size_t, SlotId> slots_;  // by sequence
  // With the prefix cache: the request of each running sequence (its ids) and how many of its
  // tokens the cache was told are written. Destroyed before the arena.
  std::unique_ptr<PrefixCache> cache_;
  std::unordered_map<std::size_t, std::pair<const TraceRequest*, std::uint64_t>> written_;
  CacheFigures cache_figures_;
  ArenaModelReport report_;
};

}  // namespace kvvm::cli
