// KvManager: the one seam between the engine's scheduler and its KV, as vLLM's scheduler sees
// one KVCacheManager and llama.cpp's context one llama_memory_i. Every sequence is admitted,
// grown, published and released through it; whether the prefix cache shares prompts, and
// whether slots are preallocated, is decided inside (docs/ARCHITECTURE.md, "The KV seam").
//
// Prefix cache on: admit() maps the longest cached chain for (prompt, tenant) and
// extend() / written() publish finished windows for later requests. Off: admit() is the
// arena's, nothing is ever cached, and extend() / written() do nothing. Preallocated: every
// admission commits the space's max_context at once and ensure() does nothing after it.
//
// The decode graphs' padding slot is the manager's too: KvSpaceOptions::sequences sizes the
// arena with it (kPadSlots), reserve_pad_slot() takes it before any sequence is admitted.
//
// Thread-safety: one scheduling thread calls everything but stats(), which any thread may call.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>

#include "kvvm/base/status.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/prefix/prefix_cache.h"

namespace kvvm::engine {

struct KvManagerOptions {
  bool prefix_cache = true;
  std::string model_identity;  // folded into the cache's keys
  // Every admission commits max_context tokens and keeps them: the preallocated-KV baseline.
  // Needs prefix_cache off (a shared window is read-only and would need an ensure to write).
  bool preallocate = false;
  // The prefix cache's events (PrefixCacheOptions::observer, ::event_block_tokens): what a
  // router indexes. Null: the space's (KvSpaceOptions::cache_observer), if any. REQUIRES:
  // outlives the manager.
  PrefixCacheObserver* cache_observer = nullptr;
  std::uint64_t event_block_tokens = 0;
};

struct KvAdmission {
  SlotId slot = 0;
  std::uint64_t cached_tokens = 0;  // already present: the caller computes from here on
};

// The KV in use as a fraction of the budget: physical bytes mapped minus what finished slots
// keep mapped for reuse (reclaimable, as vLLM's free cached blocks), over the budget; 0 on an
// idle cache and with a budget of 0. Pooled handles, cached windows no slot maps and the
// graphs' padding page are not use.
double kv_usage(const ArenaStats& arena, std::uint64_t budget_bytes);

struct KvManagerStats {
  double usage = 0;         // kv_usage(arena, the tier's budget)
  PrefixCacheStats prefix;  // all zero with the prefix cache off
  ArenaStats arena;
};

class KvManager {
 public:
  // InvalidArgument for preallocate with the prefix cache on; the prefix cache's errors.
  // REQUIRES: `space` outlives the manager; nothing else admits into its arena.
  static Result<std::unique_ptr<KvManager>> create(KvSpace& space, KvManagerOptions options);
  // Lets go of the padding slot and of every cached entry's hold.
  ~KvManager();
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  // A sequence for `prompt` (non-empty) under tenant `salt`, with what is already cached.
  // The arena's ResourceExhausted / Unavailable when it does not fit now; InvalidArgument for
  // an empty prompt or one beyond the max context. Nothing is held on failure.
  // `reuse` false: nothing is taken from the prefix cache (every prompt token will be computed,
  // its logits being wanted), and the sequence publishes nothing.
  Result<KvAdmission> admit(std::span<const std::int32_t> prompt, std::uint64_t salt,
                            bool reuse = true);
  // A child of the active sequence in `parent` holding its first `position` tokens (the
  // arena's fork: whole windows shared read-only, the boundary window copied). The child
  // publishes nothing to the prefix cache. The arena's errors; nothing is held on failure.
  Result<SlotId> fork(SlotId parent, std::uint64_t position);
  // The slot's first `tokens` tokens committed (growth); the arena's errors.
  Status ensure(SlotId slot, std::uint64_t tokens);
  // Ids of tokens generated after the prompt, so their windows can be published too.
  Status extend(SlotId slot, std::span<const std::int32_t> ids);
  // The sequence has written its first `tokens` tokens: completed windows are published.
  Status written(SlotId slot, std::uint64_t tokens);
  // The sequence is done. A failed release changed nothing: the caller may try again.
  Status release(SlotId slot);
  // Nothing runs (an idle engine): what finished slots keep mapped for reuse is unmapped and
  // the pool's spare handles are freed, so the budget holds only the prefix cache's windows
  // (and the decode graphs' padding page). Returns the bytes given back to the budget.
  std::uint64_t release_idle();

  // The decode graphs' padding rows write to a slot of their own: one token, taken before
  // any sequence. The arena's error when none is free.
  Status reserve_pad_slot();
  std::optional<SlotId> pad_slot() const { return pad_slot_; }
  void release_pad_slot();  // once nothing replays the graphs any more

  bool caching() const { return cache_ != nullptr; }
  KvManagerStats stats() const;
  KvSpace& space() const { return space_; }

 private:
  KvManager(KvSpace& space, KvManagerOptions options);

  KvSpace& space_;
  const KvManagerOptions options_;
  std::unique_ptr<PrefixCache> cache_;  // null: caching off
  std::optional<SlotId> pad_slot_;
  // Sequences the prefix cache does not know (forks, admissions without reuse): released
  // through the arena, publishing nothing.
  std::unordered_set<SlotId> uncached_;
};

}  // namespace kvvm::engine
