// KvManager: the engine's KV seam, the arena with or without the prefix cache in front.
#include "kvvm/engine/kv_manager.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace kvvm::engine {
namespace {

// The prefix cache's spelling of the engine's ids (the same bits: ids are never negative).
std::span<const TokenId> as_cache_ids(std::span<const std::int32_t> ids) {
  return {reinterpret_cast<const TokenId*>(ids.data()), ids.size()};
}

}  // namespace

KvManager::KvManager(KvSpace& space, KvManagerOptions options)
    : space_(space), options_(std::move(options)) {}

KvManager::~KvManager() {
  release_pad_slot();
  cache_.reset();  // the entries' holds go back before the arena is used by anyone else
}

Result<std::unique_ptr<KvManager>> KvManager::create(KvSpace& space, KvManagerOptions options) {
  if (options.preallocate && options.prefix_cache) {
    return Status::InvalidArgument(
        "prefix_cache: on with preallocate (a preallocated slot never grows, so it never shares)");
  }
  std::unique_ptr<KvManager> manager(new KvManager(space, std::move(options)));
  if (manager->options_.prefix_cache) {
    PrefixCacheOptions cache_options;
    cache_options.model_identity = manager->options_.model_identity;
    // The engine builds its manager itself: whoever built the space names the observer.
    const KvSpaceOptions& space_options = space.options();
    const bool own = manager->options_.cache_observer != nullptr;
    cache_options.observer = own ? manager->options_.cache_observer : space_options.cache_observer;
    cache_options.event_block_tokens =
        own ? manager->options_.event_block_tokens : space_options.event_block_tokens;
    Result<std::unique_ptr<PrefixCache>> cache =
        PrefixCache::create(space.arena(), space.governor(), std::move(cache_options));
    if (!cache.ok()) return cache.status().with_context("the engine's prefix cache");
    manager->cache_ = std::move(cache).value();
  }
  return manager;
}

Result<KvAdmission> KvManager::admit(std::span<const std::int32_t> prompt, std::uint64_t salt,
                                     bool reuse) {
  Arena& arena = space_.arena();
  KvAdmission admission;
  if (cache_ && reuse) {
    KVVM_ASSIGN_OR_RETURN(CacheAdmission a, cache_->admit(as_cache_ids(prompt), salt));
    admission.slot = a.slot;
    admission.cached_tokens = a.cached_tokens;
    uncached_.erase(a.slot);
  } else {
    KVVM_ASSIGN_OR_RETURN(SlotId slot, arena.admit(prompt.size()));
    admission.slot = slot;
    if (cache_) uncached_.insert(slot);
  }
  if (options_.preallocate) {
    const Status committed = arena.ensure(admission.slot, space_.options().max_context);
    if (!committed.ok()) {
      release(admission.slot).ignore();
      return committed;
    }
  }
  return admission;
}

Result<SlotId> KvManager::fork(SlotId parent, std::uint64_t position) {
  Arena& arena = space_.arena();
  KVVM_ASSIGN_OR_RETURN(SlotId child, arena.fork(parent, position));
  if (cache_) uncached_.insert(child);
  if (options_.preallocate) {
    const Status committed = arena.ensure(child, space_.options().max_context);
    if (!committed.ok()) {
      release(child).ignore();
      return committed;
    }
  }
  return child;
}

Status KvManager::ensure(SlotId slot, std::uint64_t tokens) {
  // Preallocated slots were committed through max_context at admission, and their live
  // length stays there: an ensure would lower it and let reclaim take the preallocation.
  if (options_.preallocate) return Status::Ok();
  return space_.arena().ensure(slot, tokens);
}

Status KvManager::extend(SlotId slot, std::span<const std::int32_t> ids) {
  if (!cache_ || uncached_.contains(slot)) return Status::Ok();
  return cache_->extend(slot, as_cache_ids(ids));
}

Status KvManager::written(SlotId slot, std::uint64_t tokens) {
  if (!cache_ || uncached_.contains(slot)) return Status::Ok();
  return cache_->written(slot, tokens);
}

Status KvManager::release(SlotId slot) {
  // A sequence ends with its windows kept mapped (reclaimable, given back under budget
  // pressure): unmapping them at every end costs the driver tens of microseconds a granule on
  // a GPU, and the next admission would pay as much again to map its own. The arena admits
  // into a finished slot's private windows, the prefix cache's next sharer of a prefix into
  // the slot that still maps it, and a preallocated slot is reused whole, as a preallocating
  // server allocates its cache once.
  if (!cache_ || uncached_.contains(slot)) {
    const Status released = space_.arena().finish(slot);
    // A failed release changed nothing: the slot stays known for the caller's retry (a
    // quarantined one is gone for good).
    if (released.ok() || released.code() == StatusCode::kFailedPrecondition) uncached_.erase(slot);
    return released;
  }
  return cache_->finish(slot);
}

std::uint64_t KvManager::release_idle() {
  // Unmapped windows go back to the pool; its spare handles then go back to the budget.
  constexpr std::uint64_t kAll = std::numeric_limits<std::uint64_t>::max();
  space_.arena().reclaim(kAll);
  return space_.arena().pool().trim(kAll);
}

Status KvManager::reserve_pad_slot() {
  if (pad_slot_) return Status::FailedPrecondition("reserve_pad_slot: already reserved");
  KVVM_ASSIGN_OR_RETURN(SlotId slot, space_.arena().admit(1));
  pad_slot_ = slot;
  return Status::Ok();
}

void KvManager::release_pad_slot() {
  if (!pad_slot_) return;
  space_.arena().release(*pad_slot_).ignore();
  pad_slot_.reset();
}

KvManagerStats KvManager::stats() const {
  KvManagerStats s;
  Arena& arena = space_.arena();
  const TierStats tier = space_.governor().stats(arena.tier());
  if (cache_) s.prefix = cache_->stats();
  s.arena = arena.stats();
  s.usage = kv_usage(s.arena, tier.limit);
  return s;
}

double kv_usage(const ArenaStats& arena, std::uint64_t budget_bytes) {
  if (budget_bytes == 0) return 0;
  const std::uint64_t in_use =
      arena.physical_bytes - std::min(arena.physical_bytes, arena.reclaimable_bytes);
  return static_cast<double>(in_use) / static_cast<double>(budget_bytes);
}

}  // namespace kvvm::engine
