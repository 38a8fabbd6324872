#include "kvvm/kv/arena_stack.h"

#include <utility>

namespace kvvm {

ArenaStack::~ArenaStack() {
  // The arena unmaps through the pool; the pool releases through the driver and hands its
  // bytes back to the governor: from the top down.
  arena_.reset();
  pool_.reset();
  owned_governor_.reset();
}

Result<std::unique_ptr<ArenaStack>> ArenaStack::create(Driver& driver, ArenaStackOptions options) {
  if (options.budget_bytes == 0) {
    return Status::InvalidArgument("budget_bytes 0 for tier '" + options.tier_name +
                                   "': an arena needs a budget to commit anything");
  }
  std::unique_ptr<ArenaStack> stack(new ArenaStack());
  if (options.governor != nullptr) {
    stack->governor_ = options.governor;
  } else {
    stack->owned_governor_ = std::make_unique<Governor>();
    stack->governor_ = stack->owned_governor_.get();
  }
  stack->tier_ = stack->governor_->add_tier(options.tier_name, options.budget_bytes);
  stack->pool_ = std::make_unique<HandlePool>(driver, options.pool, stack->governor_, stack->tier_);
  options.arena.tier = stack->tier_;
  Result<std::unique_ptr<Arena>> arena =
      Arena::create(*stack->pool_, *stack->governor_, std::move(options.arena));
  if (!arena.ok()) return arena.status().with_context("creating the arena");
  stack->arena_ = std::move(arena).value();
  return stack;
}

}  // namespace kvvm
