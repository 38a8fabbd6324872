// PrefixCache: automatic prefix sharing over an Arena (docs/ARCHITECTURE.md "Prefix cache
// keys", "Lifecycles"), as vLLM, SGLang and TensorRT-LLM do on paged blocks, but on virtual
// memory: a hit maps the cached windows read-only at the start of the new sequence's slot, so
// its KV stays one flat range and no byte is copied.
//
// Keys: one per window of a sequence, chained: key_w = hash(key_{w-1}, the ids of the tokens
// whose bytes fall in window w); the model identity and a tenant salt are folded into the root.
// A fast 128-bit hash (XXH3-128) finds candidates; the token ids stored with each entry are
// compared on every hit, so a collision can never hand one request another's KV.
//
// Publish: written(slot, n) publishes every window whose tokens are all written and known
// (the prompt, plus ids appended with extend()): the window turns read-only in the slot and
// its handles are held by the entry, so the bytes outlive the sequence (billed once, to
// whoever created them). Lookup at admission maps the longest chain of cached windows that
// ends on a token boundary and leaves at least the prompt's last token to compute (so there
// are logits to sample from); only the remainder is committed and charged.
//
// Eviction: entries mapped by active sequences are pinned. Unpinned entries stay cached and
// are evicted least recently used first, leaves before their parents, when the governor's
// reclaim hook asks for memory (registered on the arena's tier, so it runs before any
// admission is refused) or when reset() drops them all (a weight update). The evictable
// leaves (no pin, no child) are kept ordered by last use as entries are pinned, unpinned,
// gain or lose children, so a victim costs O(log n) whatever the cache holds: once the cache
// is full every admission reclaims, and a scan of every entry per reclaim made a server slow
// down in proportion to its cache.
//
// Events: with an observer (prefix_cache_events.h), every window that completes a block of
// `event_block_tokens` tokens reports the block stored as it is published, and its eviction
// reports it removed; the cache reports itself cleared when it is created and destroyed.
//
// Isolation: different salts never share (the salt is folded into the first key); with
// `enabled` false nothing is published and every lookup misses. docs/SECURITY.md explains the
// timing side channel and why the server, not the client, picks the salt.
//
// Thread-safety: one scheduler thread calls admit / extend / written / release; the governor
// may call evict() from any thread. mutex_ is a leaf with respect to the arena and the pool
// (no arena call is made while it is held).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvvm/base/mutex.h"
#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/prefix/prefix_cache_events.h"

namespace kvvm {

struct CacheKey {
  std::uint64_t low = 0;
  std::uint64_t high = 0;
  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};

// key_w from key_{w-1} and the ids of window w.
using CacheHash = std::function<CacheKey(const CacheKey& parent, std::span<const TokenId> ids)>;
// XXH3-128 over the parent key's 16 bytes followed by the ids.
CacheKey xxh3_chain_hash(const CacheKey& parent, std::span<const TokenId> ids);

struct PrefixCacheOptions {
  // Folded into every root key with the salt: a cache never serves another model's KV.
  std::string model_identity;
  bool enabled = true;  // false: no cross-request sharing at all
  CacheHash hash;       // empty: xxh3_chain_hash
  // Told what is stored and removed, in blocks (prefix_cache_events.h); null: no events.
  // REQUIRES: outlives the cache.
  PrefixCacheObserver* observer = nullptr;
  // Tokens of an event block: a multiple of hit_unit_tokens() of the arena's plan, so a block
  // ends where a hit can; 0: the smallest such multiple of at least 16 (vLLM's default block).
  std::uint64_t event_block_tokens = 0;
};

struct CacheAdmission {
  SlotId slot = 0;
  std::uint64_t cached_tokens = 0;  // already present: the caller computes from here on
};

struct PrefixCacheStats {
  std::uint64_t queries = 0;  // prompt tokens looked up (vLLM's meaning)
  std::uint64_t hits = 0;     // of which found cached
  std::uint64_t entries = 0;
  std::uint64_t cached_bytes = 0;  // held by entries, all fragments
  std::uint64_t pinned_bytes = 0;  // of which mapped by active sequences
  std::uint64_t published_windows = 0;
  std::uint64_t duplicate_windows = 0;  // written again by a sequence that missed meanwhile
  std::uint64_t evictions = 0;          // entries evicted (reclaim or reset)
  std::uint64_t evicted_bytes = 0;
  std::uint64_t collisions = 0;  // a key matched but the stored ids did not: refused
};

class PrefixCache {
 public:
  // REQUIRES: `arena` and `governor` outlive the cache. Registers the cache's eviction as a
  // reclaimer on the arena's tier.
  static Result<std::unique_ptr<PrefixCache>> create(Arena& arena, Governor& governor,
                                                     PrefixCacheOptions options);
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;
  // Drops every entry's hold (the sequences still mapping them keep their bytes).
  ~PrefixCache();

  // Admits a request for `prompt` under tenant `salt`: maps the longest usable cached chain
  // read-only, commits the rest of the prompt's windows. InvalidArgument for an empty prompt
  // or one beyond the max context; the arena's errors otherwise (nothing changed).
  Result<CacheAdmission> admit(std::span<const TokenId> prompt, std::uint64_t salt,
                               Stream stream = nullptr);
  // How many tokens of `prompt` admit() would find cached now, without pinning, mapping or
  // counting anything (a scheduler's question; also what the lookup benchmark times).
  std::uint64_t lookup(std::span<const TokenId> prompt, std::uint64_t salt) const;
  // Ids of tokens generated after the prompt, so their windows can be published too.
  Status extend(SlotId slot, std::span<const TokenId> ids);
  // The sequence has written its first `tokens` tokens: completed windows are published.
  Status written(SlotId slot, std::uint64_t tokens);
  // The sequence is done: its pins go, then Arena::release.
  Status release(SlotId slot, Stream stream = nullptr);
  // The same with Arena::finish: the slot's windows stay mapped (reclaimable), so the next
  // sharer of its prefix can take the slot with that prefix still mapped (an engine's ends).
  Status finish(SlotId slot, Stream stream = nullptr);

  // Evicts unpinned entries (least recently used leaves first) until the pool has given
  // `bytes` back to the tier or none is left; returns the bytes given back.
  std::uint64_t evict(std::uint64_t bytes);
  // Drops every unpinned entry; returns how many.
  std::uint64_t reset();
  PrefixCacheStats stats() const;
  // The block size of the events (resolved from PrefixCacheOptions::event_block_tokens).
  std::uint64_t event_block_tokens() const { return block_tokens_; }

 private:
  struct Entry {
    CacheKey key;
    Entry* parent = nullptr;
    std::vector<TokenId> ids;         // the tokens whose bytes fall in the window
    std::uint64_t window = 0;         // its index in every slot
    std::vector<HandleInfo> handles;  // one per fragment
    std::uint32_t pins = 0;           // active sequences mapping it
    std::uint32_t children = 0;       // entries whose parent this is
    std::uint64_t last_used = 0;
    bool evictable = false;  // in evictable_: no pin and no child
    // The window ends an event block reported stored: its eviction removes the block.
    bool ends_block = false;
    std::uint64_t block_hash = 0;
  };
  // Evictable leaves, least recently used first (ticks are unique).
  using LeafOrder = std::set<std::pair<std::uint64_t, Entry*>>;
  struct KeyHash {
    std::size_t operator()(const CacheKey& key) const { return key.low ^ (key.high * 31); }
  };
  struct Sequence {
    std::uint64_t salt = 0;
    std::vector<TokenId> ids;                 // prompt and extensions
    std::vector<CacheKey> keys;               // key of each window computed so far
    std::vector<Entry*> pinned;               // entries this sequence maps or published
    std::uint64_t published_windows = 0;      // windows [0, this) are entries or were offered
    std::vector<std::uint64_t> block_hashes;  // event blocks' hashes computed so far
  };

  PrefixCache(Arena& arena, Governor& governor, PrefixCacheOptions options,
              std::uint64_t block_tokens);
  CacheKey root(std::uint64_t salt) const;
  // Token ids [first, last] whose bytes fall in window w; the token after the window's end.
  std::uint64_t first_token(std::uint64_t window) const;
  std::uint64_t end_token(std::uint64_t window) const;  // one past the last token touching it
  // Computes keys for the sequence's windows whose ids are all known.
  void extend_keys(Sequence& sequence) const;
  // The event block that window w ends, if it ends one (where a hit can end).
  std::optional<std::uint64_t> block_ended_by(std::uint64_t window) const;
  // The hash of the sequence's event block b (REQUIRES: its ids are known).
  std::uint64_t block_hash_of(Sequence& sequence, std::uint64_t b) const;
  // The verified chain of entries for the sequence's windows, cut to the last-token rule and
  // a token boundary; `collided` says whether a key matched with other ids.
  std::vector<Entry*> match_locked(const Sequence& sequence, bool* collided) const
      KVVM_REQUIRES(mutex_);
  // Every change of an entry's pins, children or last use goes through these, so evictable_
  // holds exactly the entries with no pin and no child.
  void pin(Entry* entry) KVVM_REQUIRES(mutex_);
  void unpin(Entry* entry) KVVM_REQUIRES(mutex_);
  void add_child(Entry* parent) KVVM_REQUIRES(mutex_);
  void update_evictable(Entry* entry) KVVM_REQUIRES(mutex_);
  void drop_locked(Entry* entry, std::vector<HandleInfo>& unheld) KVVM_REQUIRES(mutex_);
  // The sequence in the slot is done: its pins go (release and finish).
  void forget(SlotId slot) KVVM_EXCLUDES(mutex_);

  Arena& arena_;
  Governor& governor_;
  const PrefixCacheOptions options_;
  const CacheHash hash_;
  const std::uint64_t block_tokens_;

  mutable Mutex mutex_;
  std::unordered_map<CacheKey, std::unique_ptr<Entry>, KeyHash> entries_ KVVM_GUARDED_BY(mutex_);
  std::unordered_map<SlotId, Sequence> sequences_ KVVM_GUARDED_BY(mutex_);
  LeafOrder evictable_ KVVM_GUARDED_BY(mutex_);
  std::uint64_t pinned_entries_ KVVM_GUARDED_BY(mutex_) = 0;  // entries with at least one pin
  std::uint64_t tick_ KVVM_GUARDED_BY(mutex_) = 0;
  PrefixCacheStats counters_ KVVM_GUARDED_BY(mutex_);
  Governor::Registration reclaimer_;
};

}  // namespace kvvm
