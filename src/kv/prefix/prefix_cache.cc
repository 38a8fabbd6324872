// PrefixCache: see prefix_cache.h.
//
// Why holds, not mappings, keep cached bytes: an entry whose sequences have all gone must keep
// its physical memory without being mapped anywhere (mapping it into a cache-owned range would
// cost a map and an access change per window for nothing). The pool's hold count does that:
// the handle stays in use, billed, with its content, until eviction drops the hold.
//
// Why matches end on a token boundary: a token whose bytes straddle two windows is only
// present if both windows are; a match ending inside a token would make the caller rewrite
// that token into a shared, read-only window (a copy-on-write for nothing). So the usable
// chain is cut back to the last window that ends exactly where a token ends.
//
// Why events are told under the cache's lock: a block stored by the scheduler and removed by
// a reclaim on another thread must reach the observer in the order they happened here.
#include "kvvm/kv/prefix/prefix_cache.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>

namespace kvvm {
namespace {

// The smallest block of at least vLLM's default 16 tokens that ends where hits can end.
constexpr std::uint64_t kDefaultEventBlockTokens = 16;

}  // namespace

std::uint64_t block_hash_root(std::uint64_t salt) {
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(salt >> (8 * i));
  return XXH3_64bits(bytes, sizeof bytes);
}

std::uint64_t block_hash(std::uint64_t parent, std::span<const TokenId> ids) {
  // Little-endian whatever the host, so a router on any machine recomputes the same value.
  std::vector<unsigned char> bytes(8 + 4 * ids.size());
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(parent >> (8 * i));
  for (std::size_t t = 0; t < ids.size(); ++t) {
    for (int i = 0; i < 4; ++i)
      bytes[8 + 4 * t + i] = static_cast<unsigned char>(ids[t] >> (8 * i));
  }
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::uint64_t hit_unit_tokens(std::uint64_t granule, std::uint64_t bytes_per_token) {
  return std::lcm(granule, bytes_per_token) / bytes_per_token;
}

CacheKey xxh3_chain_hash(const CacheKey& parent, std::span<const TokenId> ids) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, &parent.low, sizeof parent.low);
  XXH3_128bits_update(&state, &parent.high, sizeof parent.high);
  XXH3_128bits_update(&state, ids.data(), ids.size_bytes());
  const XXH128_hash_t hash = XXH3_128bits_digest(&state);
  return CacheKey{hash.low64, hash.high64};
}

Result<std::unique_ptr<PrefixCache>> PrefixCache::create(Arena& arena, Governor& governor,
                                                         PrefixCacheOptions options) {
  const LayoutPlan& plan = arena.plan();
  if (plan.contiguous_bytes_per_token == 0 || plan.granule == 0) {
    return Status::InvalidArgument("prefix cache over an arena whose plan has no bytes per token");
  }
  const std::uint64_t unit = hit_unit_tokens(plan.granule, plan.contiguous_bytes_per_token);
  std::uint64_t block_tokens = options.event_block_tokens;
  if (block_tokens == 0) {
    block_tokens = (kDefaultEventBlockTokens + unit - 1) / unit * unit;
  } else if (block_tokens % unit != 0) {
    return Status::InvalidArgument(
        "prefix-cache event blocks of " + std::to_string(block_tokens) +
        " tokens: a block must be a multiple of " + std::to_string(unit) +
        " tokens, where hits end (a window of " + std::to_string(plan.granule) + " bytes at " +
        std::to_string(plan.contiguous_bytes_per_token) + " bytes a token)");
  }
  return std::unique_ptr<PrefixCache>(
      new PrefixCache(arena, governor, std::move(options), block_tokens));
}

PrefixCache::PrefixCache(Arena& arena, Governor& governor, PrefixCacheOptions options,
                         std::uint64_t block_tokens)
    : arena_(arena),
      governor_(governor),
      options_(std::move(options)),
      hash_(options_.hash ? options_.hash : CacheHash(xxh3_chain_hash)),
      block_tokens_(block_tokens) {
  // A router may still index what an earlier process published under this name.
  if (options_.observer != nullptr) options_.observer->cleared();
  reclaimer_ =
      governor_.add_reclaimer(arena_.tier(), [this](std::uint64_t bytes) { return evict(bytes); });
}

PrefixCache::~PrefixCache() {
  reclaimer_ = Governor::Registration();  // waits for an eviction in progress
  std::vector<HandleInfo> unheld;
  {
    MutexLock lock(mutex_);
    for (auto& [key, entry] : entries_) {
      unheld.insert(unheld.end(), entry->handles.begin(), entry->handles.end());
    }
    entries_.clear();
    if (options_.observer != nullptr) options_.observer->cleared();
  }
  for (const HandleInfo& handle : unheld) arena_.pool().unhold(handle.handle);
}

CacheKey PrefixCache::root(std::uint64_t salt) const {
  const std::string& identity = options_.model_identity;
  std::vector<TokenId> words((identity.size() + sizeof(TokenId) - 1) / sizeof(TokenId) + 2, 0);
  std::memcpy(words.data(), identity.data(), identity.size());
  std::memcpy(words.data() + words.size() - 2, &salt, sizeof salt);
  return hash_(CacheKey{identity.size(), 0x6b76766dull /* "kvvm" */}, words);
}

std::uint64_t PrefixCache::first_token(std::uint64_t window) const {
  const LayoutPlan& plan = arena_.plan();
  return window * plan.granule / plan.contiguous_bytes_per_token;
}

std::uint64_t PrefixCache::end_token(std::uint64_t window) const {
  const LayoutPlan& plan = arena_.plan();
  const std::uint64_t end = (window + 1) * plan.granule;
  return (end + plan.contiguous_bytes_per_token - 1) / plan.contiguous_bytes_per_token;
}

void PrefixCache::extend_keys(Sequence& sequence) const {
  const std::uint64_t max_windows = arena_.plan().fragment_stride / arena_.plan().granule;
  while (sequence.keys.size() < max_windows) {
    const std::uint64_t w = sequence.keys.size();
    if (end_token(w) > sequence.ids.size()) break;
    const CacheKey parent = w == 0 ? root(sequence.salt) : sequence.keys.back();
    const std::span<const TokenId> ids(sequence.ids.data() + first_token(w),
                                       end_token(w) - first_token(w));
    sequence.keys.push_back(hash_(parent, ids));
  }
}

std::optional<std::uint64_t> PrefixCache::block_ended_by(std::uint64_t window) const {
  const LayoutPlan& plan = arena_.plan();
  const std::uint64_t end = (window + 1) * plan.granule;
  if (end % plan.contiguous_bytes_per_token != 0) return std::nullopt;
  const std::uint64_t tokens = end / plan.contiguous_bytes_per_token;
  if (tokens % block_tokens_ != 0) return std::nullopt;
  return tokens / block_tokens_ - 1;
}

std::uint64_t PrefixCache::block_hash_of(Sequence& sequence, std::uint64_t b) const {
  while (sequence.block_hashes.size() <= b) {
    const std::uint64_t i = sequence.block_hashes.size();
    const std::uint64_t parent =
        i == 0 ? block_hash_root(sequence.salt) : sequence.block_hashes.back();
    sequence.block_hashes.push_back(block_hash(
        parent, std::span<const TokenId>(sequence.ids).subspan(i * block_tokens_, block_tokens_)));
  }
  return sequence.block_hashes[b];
}

std::vector<PrefixCache::Entry*> PrefixCache::match_locked(const Sequence& sequence,
                                                           bool* collided) const {
  // The longest verified chain whose windows leave the last prompt token to compute, cut
  // back to a window that ends on a token boundary.
  const LayoutPlan& plan = arena_.plan();
  std::vector<Entry*> matched;
  Entry* parent = nullptr;
  for (std::uint64_t w = 0; options_.enabled && w < sequence.keys.size(); ++w) {
    if (end_token(w) > sequence.ids.size() - 1) break;
    auto it = entries_.find(sequence.keys[w]);
    if (it == entries_.end()) break;
    Entry* entry = it->second.get();
    const std::span<const TokenId> ids(sequence.ids.data() + first_token(w),
                                       end_token(w) - first_token(w));
    if (entry->window != w || entry->parent != parent ||
        !std::equal(ids.begin(), ids.end(), entry->ids.begin(), entry->ids.end())) {
      *collided = true;
      break;
    }
    matched.push_back(entry);
    parent = entry;
  }
  while (!matched.empty() && matched.size() * plan.granule % plan.contiguous_bytes_per_token != 0) {
    matched.pop_back();
  }
  return matched;
}

std::uint64_t PrefixCache::lookup(std::span<const TokenId> prompt, std::uint64_t salt) const {
  if (prompt.empty()) return 0;
  Sequence sequence;
  sequence.salt = salt;
  sequence.ids.assign(prompt.begin(), prompt.end());
  extend_keys(sequence);
  MutexLock lock(mutex_);
  bool collided = false;
  const std::size_t windows = match_locked(sequence, &collided).size();
  return windows * arena_.plan().granule / arena_.plan().contiguous_bytes_per_token;
}

Result<CacheAdmission> PrefixCache::admit(std::span<const TokenId> prompt, std::uint64_t salt,
                                          Stream stream) {
  const LayoutPlan& plan = arena_.plan();
  if (prompt.empty() || prompt.size() > plan.max_context) {
    return Status::InvalidArgument("prefix-cache admission of a " + std::to_string(prompt.size()) +
                                   "-token prompt: between 1 and the max context of " +
                                   std::to_string(plan.max_context) + " tokens");
  }
  Sequence sequence;
  sequence.salt = salt;
  sequence.ids.assign(prompt.begin(), prompt.end());
  extend_keys(sequence);

  // Pinned before the lock goes, so eviction cannot take the chain before it is mapped.
  std::vector<Entry*> matched;
  std::uint64_t cached_tokens = 0;
  {
    MutexLock lock(mutex_);
    counters_.queries += prompt.size();
    bool collided = false;
    matched = match_locked(sequence, &collided);
    if (collided) ++counters_.collisions;
    cached_tokens = matched.size() * plan.granule / plan.contiguous_bytes_per_token;
    for (Entry* entry : matched) pin(entry);
  }

  Result<SlotId> slot = Status::Internal("unset");
  if (matched.empty()) {
    slot = arena_.admit(prompt.size());
  } else {
    const std::uint64_t k = matched.size();
    std::vector<HandleInfo> handles(plan.fragments * k);
    for (std::uint64_t w = 0; w < k; ++w) {
      for (std::uint64_t f = 0; f < plan.fragments; ++f) {
        handles[f * k + w] = matched[w]->handles[f];
      }
    }
    SharedPrefixInfo info;
    info.tokens = cached_tokens;
    info.fragments = plan.fragments;
    info.windows_per_fragment = k;
    info.shared_bytes = plan.fragments * k * plan.granule;
    std::shared_ptr<SharedPrefix> prefix =
        SharedPrefix::create(arena_.pool(), plan, info, std::move(handles));
    slot = arena_.admit_shared(*prefix, prompt.size(), stream);
  }
  MutexLock lock(mutex_);
  if (!slot.ok()) {
    for (Entry* entry : matched) unpin(entry);
    return slot.status().with_context("prefix-cache admission");
  }
  counters_.hits += cached_tokens;
  sequence.pinned = matched;
  sequence.published_windows = matched.size();
  sequences_[*slot] = std::move(sequence);
  return CacheAdmission{*slot, cached_tokens};
}

Status PrefixCache::extend(SlotId slot, std::span<const TokenId> ids) {
  MutexLock lock(mutex_);
  auto it = sequences_.find(slot);
  if (it == sequences_.end()) {
    return Status::FailedPrecondition("extend of slot " + std::to_string(slot) +
                                      ": not admitted through the prefix cache");
  }
  it->second.ids.insert(it->second.ids.end(), ids.begin(), ids.end());
  extend_keys(it->second);
  return Status::Ok();
}

Status PrefixCache::written(SlotId slot, std::uint64_t tokens) {
  std::uint64_t from = 0;
  std::uint64_t to = 0;
  {
    MutexLock lock(mutex_);
    auto it = sequences_.find(slot);
    if (it == sequences_.end()) {
      return Status::FailedPrecondition("written of slot " + std::to_string(slot) +
                                        ": not admitted through the prefix cache");
    }
    Sequence& sequence = it->second;
    if (tokens > sequence.ids.size()) {
      return Status::InvalidArgument("written of slot " + std::to_string(slot) + ": " +
                                     std::to_string(tokens) + " tokens, but only " +
                                     std::to_string(sequence.ids.size()) +
                                     " ids are known (pass generated ids with extend() first)");
    }
    from = sequence.published_windows;
    to = from;
    while (to < sequence.keys.size() && end_token(to) <= tokens) ++to;
    if (!options_.enabled) {
      sequence.published_windows = to;
      return Status::Ok();
    }
  }
  if (to == from) return Status::Ok();
  Result<std::vector<HandleInfo>> sealed = arena_.seal_windows(slot, from, to);
  if (!sealed.ok()) return sealed.status().with_context("prefix-cache publish");
  const LayoutPlan& plan = arena_.plan();
  const std::uint64_t count = to - from;
  std::vector<Handle> to_hold;
  MutexLock lock(mutex_);
  auto it = sequences_.find(slot);
  if (it == sequences_.end()) return Status::Ok();  // released meanwhile
  Sequence& sequence = it->second;
  // Blocks that become hittable here, told in runs of consecutive blocks.
  StoredBlocks run;
  run.block_tokens = block_tokens_;
  std::uint64_t next_block = 0;
  const auto tell = [&] {
    if (!run.hashes.empty()) options_.observer->stored(run);
    run.hashes.clear();
    run.ids.clear();
  };
  for (std::uint64_t w = from; w < to; ++w) {
    const CacheKey& key = sequence.keys[w];
    Entry* parent = nullptr;
    if (w > 0) {
      auto up = entries_.find(sequence.keys[w - 1]);
      parent = up == entries_.end() ? nullptr : up->second.get();
    }
    if (entries_.contains(key) || (w > 0 && parent == nullptr)) {
      // Written meanwhile by a sequence that missed, or its parent was evicted: keep this
      // copy private (it stays read-only in the slot; a later write unlocks it in place).
      ++counters_.duplicate_windows;
      continue;
    }
    auto entry = std::make_unique<Entry>();
    entry->key = key;
    entry->parent = parent;
    entry->window = w;
    entry->ids.assign(sequence.ids.begin() + static_cast<std::ptrdiff_t>(first_token(w)),
                      sequence.ids.begin() + static_cast<std::ptrdiff_t>(end_token(w)));
    for (std::uint64_t f = 0; f < plan.fragments; ++f) {
      entry->handles.push_back((*sealed)[f * count + (w - from)]);
      to_hold.push_back(entry->handles.back().handle);
    }
    if (const std::optional<std::uint64_t> b = block_ended_by(w);
        b.has_value() && options_.observer != nullptr) {
      // Every window up to this one is an entry (a window is cached only under its parent).
      entry->ends_block = true;
      entry->block_hash = block_hash_of(sequence, *b);
      if (run.hashes.empty() || *b != next_block) {
        tell();
        run.parent = *b > 0 ? std::optional(block_hash_of(sequence, *b - 1)) : std::nullopt;
      }
      run.hashes.push_back(entry->block_hash);
      const auto first = sequence.ids.begin() + static_cast<std::ptrdiff_t>(*b * block_tokens_);
      run.ids.insert(run.ids.end(), first, first + static_cast<std::ptrdiff_t>(block_tokens_));
      next_block = *b + 1;
    }
    pin(entry.get());
    if (parent != nullptr) add_child(parent);
    sequence.pinned.push_back(entry.get());
    entries_.emplace(key, std::move(entry));
    ++counters_.published_windows;
  }
  if (options_.observer != nullptr) tell();
  sequence.published_windows = to;
  // The pool's lock is a leaf below this one.
  for (Handle handle : to_hold) arena_.pool().hold(handle);
  return Status::Ok();
}

void PrefixCache::pin(Entry* entry) {
  if (entry->evictable) {
    evictable_.erase({entry->last_used, entry});
    entry->evictable = false;
  }
  if (entry->pins++ == 0) ++pinned_entries_;
  entry->last_used = ++tick_;
}

void PrefixCache::unpin(Entry* entry) {
  if (entry->pins == 0) return;
  if (--entry->pins == 0) --pinned_entries_;
  update_evictable(entry);
}

void PrefixCache::add_child(Entry* parent) {
  ++parent->children;
  update_evictable(parent);
}

void PrefixCache::update_evictable(Entry* entry) {
  const bool leaf = entry->pins == 0 && entry->children == 0;
  if (leaf == entry->evictable) return;
  if (leaf) {
    evictable_.emplace(entry->last_used, entry);
  } else {
    evictable_.erase({entry->last_used, entry});
  }
  entry->evictable = leaf;
}

void PrefixCache::forget(SlotId slot) {
  MutexLock lock(mutex_);
  auto it = sequences_.find(slot);
  if (it == sequences_.end()) return;
  for (Entry* entry : it->second.pinned) unpin(entry);
  sequences_.erase(it);
}

Status PrefixCache::release(SlotId slot, Stream stream) {
  forget(slot);
  return arena_.release(slot, stream);
}

Status PrefixCache::finish(SlotId slot, Stream stream) {
  forget(slot);
  return arena_.finish(slot, stream);
}

void PrefixCache::drop_locked(Entry* entry, std::vector<HandleInfo>& unheld) {
  unheld.insert(unheld.end(), entry->handles.begin(), entry->handles.end());
  if (entry->evictable) evictable_.erase({entry->last_used, entry});
  if (entry->pins > 0) --pinned_entries_;
  if (Entry* parent = entry->parent; parent != nullptr) {
    --parent->children;
    update_evictable(parent);
  }
  if (entry->ends_block && options_.observer != nullptr) {
    options_.observer->removed(std::span<const std::uint64_t>(&entry->block_hash, 1));
  }
  counters_.evicted_bytes += entry->handles.size() * arena_.plan().granule;
  ++counters_.evictions;
  entries_.erase(entry->key);
}

std::uint64_t PrefixCache::evict(std::uint64_t bytes) {
  HandlePool& pool = arena_.pool();
  const std::uint64_t released_before = pool.released_bytes();
  const auto given_back = [&] { return pool.released_bytes() - released_before; };
  // One victim per lock: the scheduler's admissions wait on mutex_, and the pool's calls
  // below reach the driver. A parent left childless joins evictable_ in drop_locked, by its
  // own last use (a parent is used before its children on every hit, so it is older).
  while (given_back() < bytes) {
    std::vector<HandleInfo> unheld;
    {
      MutexLock lock(mutex_);
      if (evictable_.empty()) break;
      drop_locked(evictable_.begin()->second, unheld);
    }
    for (const HandleInfo& handle : unheld) pool.unhold(handle.handle);
    if (given_back() < bytes) pool.trim(bytes - given_back());
  }
  return given_back();
}

std::uint64_t PrefixCache::reset() {
  std::vector<HandleInfo> unheld;
  std::uint64_t dropped = 0;
  {
    MutexLock lock(mutex_);
    while (!evictable_.empty()) {
      drop_locked(evictable_.begin()->second, unheld);
      ++dropped;
    }
  }
  for (const HandleInfo& handle : unheld) arena_.pool().unhold(handle.handle);
  return dropped;
}

PrefixCacheStats PrefixCache::stats() const {
  MutexLock lock(mutex_);
  PrefixCacheStats stats = counters_;
  const std::uint64_t window_bytes = arena_.plan().fragments * arena_.plan().granule;
  stats.entries = entries_.size();
  stats.cached_bytes = stats.entries * window_bytes;
  stats.pinned_bytes = pinned_entries_ * window_bytes;
  return stats;
}

}  // namespace kvvm
