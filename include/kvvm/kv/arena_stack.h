// ArenaStack: an Arena with what it stands on, assembled in one place: a Governor with one
// tier whose limit is the budget, a HandlePool charging that tier, and the Arena over the
// pool. Every tool, benchmark and the engine's KV space build theirs here, so the order of
// construction and the reverse order of teardown (arena, pool, governor) are written once.
//
// Why one tier per stack: a stack is one KV cache with one budget. A caller who needs a tier
// beside the KV (the model's weights) lends the governor both live under
// (ArenaStackOptions::governor).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/kv/arena.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/handle_pool.h"

namespace kvvm {

struct ArenaStackOptions {
  std::string tier_name = "kv";    // the governor tier's name (its stats and errors say it)
  std::uint64_t budget_bytes = 0;  // the tier's limit: what the arena and its pool may hold
  PoolOptions pool{};
  // A governor to add the tier to (not owned; outlives the stack), so the KV shares one device
  // budget with another tier (the model's weights); null: a governor of the stack's own.
  Governor* governor = nullptr;
  // The arena's options; `arena.tier` is ignored (the stack's own tier is used).
  ArenaOptions arena{};
};

class ArenaStack {
 public:
  // `driver` must outlive the stack. InvalidArgument for a budget of 0; Arena::create's
  // errors (a plan whose granule is not the driver's, addresses short) with what was being
  // created named. Nothing is left behind on failure.
  static Result<std::unique_ptr<ArenaStack>> create(Driver& driver, ArenaStackOptions options);
  ~ArenaStack();
  ArenaStack(const ArenaStack&) = delete;
  ArenaStack& operator=(const ArenaStack&) = delete;

  Arena& arena() { return *arena_; }
  const Arena& arena() const { return *arena_; }
  HandlePool& pool() { return *pool_; }
  Governor& governor() { return *governor_; }
  TierId tier() const { return tier_; }

 private:
  ArenaStack() = default;
  // Declaration order is construction order; the destructor tears down in reverse.
  std::unique_ptr<Governor> owned_governor_;  // null when the caller lent one
  Governor* governor_ = nullptr;
  TierId tier_ = 0;
  std::unique_ptr<HandlePool> pool_;
  std::unique_ptr<Arena> arena_;
};

}  // namespace kvvm
