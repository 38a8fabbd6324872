#include "sim/arena_model.h"

#include <chrono>
#include <utility>

namespace kvvm::cli {
namespace {

bool no_room(const Status& status) {
  return status.code() == StatusCode::kResourceExhausted ||
         status.code() == StatusCode::kUnavailable;
}

}  // namespace

ArenaModel::ArenaModel(Driver& driver, ArenaModelOptions options)
    : driver_(driver), options_(std::move(options)) {}

ArenaModel::~ArenaModel() {
  // Every sequence still running goes back before the arena does (an aborted run).
  for (const auto& [seq, slot] : slots_) {
    (cache_ ? cache_->release(slot) : arena().release(slot)).ignore();
  }
  cache_.reset();
  prefixes_.clear();
  stack_.reset();
}

Result<std::unique_ptr<ArenaModel>> ArenaModel::create(Driver& driver, ArenaModelOptions options) {
  std::unique_ptr<ArenaModel> model(new ArenaModel(driver, std::move(options)));
  const ArenaModelOptions& o = model->options_;
  KVVM_ASSIGN_OR_RETURN(
      std::unique_ptr<ArenaStack> stack,
      ArenaStack::create(
          driver,
          ArenaStackOptions{.tier_name = "simulate",
                            .budget_bytes = o.budget,
                            .pool = PoolOptions{.max_pooled_bytes = o.pool_bytes},
                            .arena = ArenaOptions{.plan = o.plan,
                                                  .max_slots = o.max_slots,
                                                  .commit_ahead_windows = o.commit_ahead_windows,
                                                  .budget_wait = std::chrono::milliseconds(0)}}));
  model->stack_ = std::move(stack);
  if (o.prefix_cache) {
    PrefixCacheOptions cache_options;
    cache_options.model_identity = o.plan.geometry.name;
    Result<std::unique_ptr<PrefixCache>> cache = PrefixCache::create(
        model->stack_->arena(), model->stack_->governor(), std::move(cache_options));
    if (!cache.ok()) return cache.status().with_context("creating the prefix cache");
    model->cache_ = std::move(cache).value();
    model->cache_figures_.enabled = true;
    model->cache_figures_.bytes_per_token = o.plan.geometry.bytes_per_token();
  }
  model->calls_before_ = driver.counts();
  return model;
}

template <typename Call>
auto ArenaModel::timed(Call&& call) -> decltype(call()) {
  const auto start = std::chrono::steady_clock::now();
  auto result = call();
  report_.arena_call_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++report_.arena_calls;
  return result;
}

Result<SlotId> ArenaModel::admit_with_prefix(const TraceRequest& request, std::uint64_t tokens) {
  const bool shares =
      options_.sharing && request.prefix_group != kNoPrefixGroup && request.prefix_tokens > 0;
  std::shared_ptr<SharedPrefix>* prefix = nullptr;
  if (shares) {
    prefix = &prefixes_[{request.prefix_group, request.prefix_tokens}];
    if (*prefix && !(*prefix)->usable()) {
      prefix->reset();
      ++report_.stale_prefixes;
    }
    if (*prefix) {
      Result<SlotId> slot = timed([&] { return arena().admit_shared(**prefix, tokens); });
      if (slot.ok()) {
        ++report_.shared_admissions;
        return slot;
      }
      if (slot.status().code() != StatusCode::kFailedPrecondition) return slot;
      // Went stale between usable() and the admission: publish again below.
      prefix->reset();
      ++report_.stale_prefixes;
    }
  }
  Result<SlotId> slot = timed([&] { return arena().admit(tokens); });
  if (!slot.ok() || !shares) return slot;
  Result<std::shared_ptr<SharedPrefix>> published =
      timed([&] { return arena().publish(*slot, request.prefix_tokens); });
  if (published.ok()) {
    *prefix = std::move(published).value();
    ++report_.publishes;
  } else if (published.status().code() == StatusCode::kFailedPrecondition) {
    if (report_.publish_refusals++ == 0) {
      report_.publish_refusal_reason = published.status().message();
    }
  } else {
    // The sequence is admitted but publishing failed at run time: give it back, report.
    arena().release(*slot).ignore();
    return published.status().with_context("publishing " + std::to_string(request.prefix_tokens) +
                                           " prefix tokens");
  }
  return slot;
}

Result<bool> ArenaModel::admit(std::size_t seq, const TraceRequest& request, std::uint64_t tokens) {
  std::uint64_t hit = 0;
  Result<SlotId> slot = Status::Internal("unset");
  if (cache_) {
    if (!request.ids || request.ids->size() < tokens) {
      return Status::Internal("kvvm+cache: request " + std::to_string(seq) + " has no token ids");
    }
    Result<CacheAdmission> admitted = timed([&] {
      return cache_->admit(std::span<const TokenId>(request.ids->data(), tokens), request.salt);
    });
    if (admitted.ok()) {
      hit = admitted->cached_tokens;
      slot = admitted->slot;
    } else {
      slot = admitted.status();
    }
  } else {
    slot = admit_with_prefix(request, tokens);
  }
  if (!slot.ok()) {
    if (!no_room(slot.status())) {
      return slot.status().with_context("admitting request " + std::to_string(seq));
    }
    ++(slot.status().code() == StatusCode::kUnavailable ? report_.refused_slots
                                                        : report_.refused_budget);
    return false;
  }
  slots_[seq] = *slot;
  if (cache_) {
    cache_figures_.queries += tokens;
    cache_figures_.hits += hit;
    written_[seq] = {&request, tokens};
    // Prefill wrote the whole prompt: its completed windows enter the cache.
    Status published = timed([&] { return cache_->written(*slot, tokens); });
    if (!published.ok()) return published.with_context("publishing request " + std::to_string(seq));
  }
  return true;
}

Result<bool> ArenaModel::grow(std::size_t seq, std::uint64_t tokens) {
  auto it = slots_.find(seq);
  if (it == slots_.end()) {
    return Status::Internal("kvvm: sequence " + std::to_string(seq) + " is not running");
  }
  Status grown = timed([&] { return arena().ensure(it->second, tokens); });
  if (grown.ok() && cache_) {
    auto& [request, written] = written_[seq];
    if (request->ids->size() < tokens) {
      return Status::Internal("kvvm+cache: request " + std::to_string(seq) + " has no token ids");
    }
    const std::span<const TokenId> generated(request->ids->data() + written, tokens - written);
    Status published = timed([&] {
      Status extended = cache_->extend(it->second, generated);
      return extended.ok() ? cache_->written(it->second, tokens) : extended;
    });
    if (!published.ok()) return published.with_context("publishing request " + std::to_string(seq));
    written = tokens;
  }
  if (grown.ok()) return true;
  if (grown.code() == StatusCode::kResourceExhausted) {
    ++report_.grow_refusals;
    return false;
  }
  return grown.with_context("growing request " + std::to_string(seq) + " to " +
                            std::to_string(tokens) + " tokens");
}

Status ArenaModel::release(std::size_t seq) {
  auto it = slots_.find(seq);
  if (it == slots_.end()) {
    return Status::Internal("kvvm: sequence " + std::to_string(seq) + " is not running");
  }
  Status released =
      timed([&] { return cache_ ? cache_->release(it->second) : arena().release(it->second); });
  slots_.erase(it);
  written_.erase(seq);
  if (!released.ok()) return released.with_context("releasing request " + std::to_string(seq));
  return Status::Ok();
}

MemorySample ArenaModel::sample() const {
  const ArenaStats stats = arena().stats();
  // Finished slots whose fence had not completed yet hold reclaimable windows: memory, but
  // not backing a running sequence, so they count as used and not as committed.
  return {stats.committed_bytes - stats.reclaimable_bytes, stats.live_bytes,
          stats.shared_saved_bytes, stack_->governor().stats(stack_->tier()).used};
}

CacheFigures ArenaModel::cache() const {
  CacheFigures figures = cache_figures_;
  if (cache_) {
    const PrefixCacheStats stats = cache_->stats();
    figures.evictions = stats.evictions;
    figures.cached_bytes = stats.cached_bytes;
    figures.published = stats.published_windows;
  }
  return figures;
}

ArenaModelReport ArenaModel::report() const {
  ArenaModelReport report = report_;
  report.arena = arena().stats();
  report.tier = stack_->governor().stats(stack_->tier());
  report.pool = stack_->pool().snapshot();
  const DriverCallCounts now = driver_.counts();
  for (std::size_t op = 0; op < kDriverOpCount; ++op) {
    report.calls.calls[op] = now.calls[op] - calls_before_.calls[op];
    report.calls.failures[op] = now.failures[op] - calls_before_.failures[op];
  }
  return report;
}

}  // namespace kvvm::cli
