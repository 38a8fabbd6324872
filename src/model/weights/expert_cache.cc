// ExpertCache: slot bookkeeping, the frequency policy and the copies of misses.
#include "model/weights/expert_cache.h"

#include <chrono>
#include <string>

#include "kvvm/base/check.h"

namespace kvvm::model::detail {

Status wanted_experts(std::span<const std::int32_t> ids, std::uint32_t experts,
                      std::vector<std::uint32_t>& wanted, std::vector<std::uint32_t>& rows) {
  rows.assign(experts, 0);
  for (const std::int32_t id : ids) {
    if (id < 0 || static_cast<std::uint32_t>(id) >= experts) {
      return Status::InvalidArgument("the router chose expert " + std::to_string(id) + " of " +
                                     std::to_string(experts));
    }
    ++rows[static_cast<std::size_t>(id)];
  }
  // Compacted in place: the e-th count moves to a place at or before e, already read.
  wanted.clear();
  for (std::uint32_t e = 0; e < experts; ++e) {
    if (rows[e] == 0) continue;
    rows[wanted.size()] = rows[e];
    wanted.push_back(e);
  }
  rows.resize(wanted.size());
  return Status::Ok();
}

ExpertCache::ExpertCache(const ExpertCacheShape& shape, Address first_slot,
                         const unsigned char* staging, Copy copy)
    : shape_(shape), first_slot_(first_slot), staging_(staging), copy_(std::move(copy)) {
  const std::uint64_t experts = std::uint64_t{shape.sparse_layers} * shape.experts;
  KVVM_CHECK(shape.slots > 0 && shape.slots <= experts, "expert cache: slots out of range");
  slot_of_.assign(experts, kEmpty);
  count_.assign(experts, 0);
  last_use_.assign(experts, 0);
  holder_.assign(shape.slots, kEmpty);
}

Address ExpertCache::slot_address(std::uint32_t slot) const {
  return first_slot_ + std::uint64_t{slot} * shape_.expert_bytes;
}

const unsigned char* ExpertCache::staged(std::uint32_t expert_index) const {
  return staging_ + std::uint64_t{expert_index} * shape_.expert_bytes;
}

ExpertCache::Key ExpertCache::key_of(std::uint32_t slot) const {
  const std::uint32_t e = holder_[slot];
  return Key{count_[e], last_use_[e], slot};
}

Status ExpertCache::fill(std::uint32_t slot, std::uint32_t expert_index) {
  return copy_(slot_address(slot), staged(expert_index), shape_.expert_bytes);
}

Status ExpertCache::preload() {
  for (std::uint32_t s = 0; s < shape_.slots; ++s) {
    const std::uint32_t index = preloaded_expert(shape_, s);
    const std::uint32_t layer = index / shape_.experts, expert = index % shape_.experts;
    if (holder_[s] != kEmpty) evictable_.erase(key_of(s));
    KVVM_RETURN_IF_ERROR(fill(s, index).with_context(
        "expert cache: loading expert " + std::to_string(expert) + " of sparse layer " +
        std::to_string(layer) + " into slot " + std::to_string(s)));
    holder_[s] = index;
    slot_of_[index] = s;
    evictable_.insert(key_of(s));
  }
  return Status::Ok();
}

void ExpertCache::decay() {
  for (std::uint64_t& count : count_) count /= 2;
  evictable_.clear();
  for (std::uint32_t s = 0; s < shape_.slots; ++s) {
    if (holder_[s] != kEmpty) evictable_.insert(key_of(s));
  }
}

Status ExpertCache::timed(const std::function<Status()>& work) {
  const auto started = std::chrono::steady_clock::now();
  Status status = work();
  copy_ns_.fetch_add(
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now() - started)
                                     .count()),
      std::memory_order_relaxed);
  return status;
}

Status ExpertCache::acquire(std::uint32_t layer, std::span<const std::uint32_t> ids,
                            std::span<const std::uint32_t> rows, std::span<Address> at) {
  KVVM_CHECK(layer < shape_.sparse_layers, "expert cache: no such sparse layer");
  KVVM_CHECK(ids.size() <= shape_.slots && rows.size() == ids.size() && at.size() == ids.size(),
             "expert cache: more experts than slots, or spans of unequal sizes");
  if (++acquisitions_ % kDecayAcquires == 0) decay();
  const std::uint64_t now = acquisitions_;
  // Hits first: every wanted resident expert leaves the evictable set, so no miss of this
  // acquisition can take its slot.
  wanted_slots_.clear();
  std::uint64_t hits = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    KVVM_CHECK(ids[i] < shape_.experts, "expert cache: no such expert");
    const std::uint32_t index = layer * shape_.experts + ids[i];
    const std::uint32_t slot = slot_of_[index];
    if (slot == kEmpty) continue;
    evictable_.erase(key_of(slot));
    count_[index] += rows[i];
    last_use_[index] = now;
    wanted_slots_.push_back(slot);
    at[i] = slot_address(slot);
    ++hits;
  }
  lookups_.fetch_add(ids.size(), std::memory_order_relaxed);
  hits_.fetch_add(hits, std::memory_order_relaxed);
  Status status = Status::Ok();
  for (std::size_t i = 0; i < ids.size() && status.ok(); ++i) {
    const std::uint32_t index = layer * shape_.experts + ids[i];
    if (slot_of_[index] != kEmpty) continue;
    // ids.size() <= slots and every wanted slot is out of the set, so a victim remains.
    KVVM_CHECK(!evictable_.empty(), "expert cache: no slot to evict");
    const std::uint32_t slot = std::get<2>(*evictable_.begin());
    status = timed([&] { return fill(slot, index); });
    if (!status.ok()) {
      status = status.with_context("expert cache: copying expert " + std::to_string(ids[i]) +
                                   " of sparse layer " + std::to_string(layer) +
                                   " from host memory into slot " + std::to_string(slot));
      break;
    }
    evictable_.erase(evictable_.begin());
    slot_of_[holder_[slot]] = kEmpty;
    holder_[slot] = index;
    slot_of_[index] = slot;
    count_[index] += rows[i];
    last_use_[index] = now;
    wanted_slots_.push_back(slot);
    at[i] = slot_address(slot);
    misses_.fetch_add(1, std::memory_order_relaxed);
    bytes_copied_.fetch_add(shape_.expert_bytes, std::memory_order_relaxed);
  }
  // Wanted now, evictable by the next acquisition (its compute is done by then: the CPU runs in
  // order).
  for (std::uint32_t slot : wanted_slots_) evictable_.insert(key_of(slot));
  return status;
}

ExpertCacheStats ExpertCache::stats() const {
  ExpertCacheStats out;
  out.slots = shape_.slots;
  out.experts = std::uint64_t{shape_.sparse_layers} * shape_.experts;
  out.lookups = lookups_.load(std::memory_order_relaxed);
  out.hits = hits_.load(std::memory_order_relaxed);
  out.misses = misses_.load(std::memory_order_relaxed);
  out.bytes_copied = bytes_copied_.load(std::memory_order_relaxed);
  out.copy_seconds = static_cast<double>(copy_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return out;
}

std::optional<std::uint32_t> ExpertCache::slot_of(std::uint32_t layer, std::uint32_t expert) const {
  const std::uint32_t slot = slot_of_[layer * shape_.experts + expert];
  if (slot == kEmpty) return std::nullopt;
  return slot;
}

}  // namespace kvvm::model::detail
