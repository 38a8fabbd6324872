// HandlePool: see handle_pool.h. The pool is the one owner of physical handles; reservations
// hold mappings of them. Driver calls (create, release) are made outside mutex_ so a slow
// driver never blocks another thread's pool hit.
#include "kvvm/vmm/handle_pool.h"

#include <string>

#include "kvvm/base/bytes.h"
#include "kvvm/base/check.h"
#include "kvvm/base/log.h"

namespace kvvm {

std::string_view to_string(HandleState state) {
  switch (state) {
    case HandleState::kPooled:
      return "pooled";
    case HandleState::kInUse:
      return "in use";
    case HandleState::kQuarantined:
      return "quarantined";
    case HandleState::kReleased:
      return "released";
  }
  return "unknown";
}

HandlePool::HandlePool(Driver& driver, PoolOptions options, Governor* governor, TierId tier)
    : driver_(driver),
      options_(options),
      governor_(governor),
      tier_(tier),
      granule_(driver.granule()) {
  if (governor_ != nullptr) {
    reclaimer_ =
        governor_->add_reclaimer(tier_, [this](std::uint64_t wanted) { return trim(wanted); });
  }
}

HandlePool::~HandlePool() {
  reclaimer_ = Governor::Registration();  // no reclaim can start while we tear down
  trim(UINT64_MAX);
  const PoolSnapshot left = snapshot();
  if (left.handles_in_use + left.handles_quarantined > 0) {
    log(LogLevel::kWarning, "handle pool destroyed with " + std::to_string(left.handles_in_use) +
                                " handle(s) in use (" + format_bytes(left.mapped_bytes) + ") and " +
                                std::to_string(left.handles_quarantined) + " quarantined (" +
                                format_bytes(left.quarantined_bytes) +
                                "); they are left to the driver's teardown");
  }
}

Result<Handle> HandlePool::checkout(std::size_t bytes, Grant* grant, bool* created_now) {
  if (created_now != nullptr) *created_now = false;
  if (bytes == 0 || bytes % granule_ != 0) {
    return Status::InvalidArgument("checkout of " + std::to_string(bytes) +
                                   " bytes: not a positive multiple of the granule " +
                                   std::to_string(granule_));
  }
  {
    MutexLock lock(mutex_);
    auto bucket = pooled_.find(bytes);
    if (bucket != pooled_.end() && !bucket->second.empty()) {
      const Handle handle = bucket->second.back();
      bucket->second.pop_back();
      Entry& entry = entries_.at(handle);
      entry.state = HandleState::kInUse;
      entry.mappings = 0;
      entry.epoch = ++next_epoch_;
      ++counters_.pool_hits;
      return handle;
    }
  }
  // Check before creating: if the grant is short nothing is created. A grant belongs to
  // one caller, so what remains cannot shrink between this check and the charge below.
  KVVM_RETURN_IF_ERROR(check_grant(bytes, grant));
  Result<Handle> created = driver_.create(bytes);
  if (!created.ok()) {
    return created.status().with_context("creating a " + format_bytes(bytes) + " handle");
  }
  if (governor_ != nullptr) {
    Status charged = grant->charge(bytes);
    if (!charged.ok()) {  // only if the grant was shared against its contract
      driver_.release(*created).ignore();
      return charged;
    }
  }
  MutexLock lock(mutex_);
  entries_.emplace(*created, Entry{bytes, HandleState::kInUse, 0, ++next_epoch_});
  ++counters_.creates;
  if (created_now != nullptr) *created_now = true;
  return created;
}

Status HandlePool::check_grant(std::size_t bytes, const Grant* grant) const {
  if (governor_ == nullptr) return Status::Ok();
  if (grant == nullptr || !grant->active()) {
    return Status::FailedPrecondition("creating a " + std::to_string(bytes) +
                                      "-byte handle needs a grant from the governor");
  }
  if (grant->tier() != tier_) {
    return Status::InvalidArgument("grant is for tier " + std::to_string(grant->tier()) +
                                   ", this pool charges tier " + std::to_string(tier_));
  }
  if (grant->remaining() < bytes) {
    const auto remaining = grant->remaining();
    return Status::ResourceExhausted(
        "creating a " + std::to_string(bytes) + "-byte handle needs more than the " +
            std::to_string(remaining) + " bytes left in the grant of " +
            std::to_string(grant->prepared()),
        Exhaustion{bytes, remaining, grant->prepared()});
  }
  return Status::Ok();
}

Result<int> HandlePool::export_handle(Handle handle) {
  {
    MutexLock lock(mutex_);
    auto it = entries_.find(handle);
    if (it == entries_.end() || it->second.state != HandleState::kInUse) {
      return Status::FailedPrecondition("export of handle " + std::to_string(handle) +
                                        ": only an in-use handle can be exported");
    }
    // Marked before the descriptor exists: from then on another process may map it. A failed
    // export leaves the mark, which costs only reuse of this one handle.
    it->second.crosses_processes = true;
  }
  return driver_.export_handle(handle);
}

Result<Handle> HandlePool::import_handle(int fd, std::size_t bytes, Grant* grant) {
  if (bytes == 0 || bytes % granule_ != 0) {
    return Status::InvalidArgument("import of " + std::to_string(bytes) +
                                   " bytes: not a positive multiple of the granule " +
                                   std::to_string(granule_));
  }
  KVVM_RETURN_IF_ERROR(check_grant(bytes, grant));
  Result<Handle> imported = driver_.import_handle(fd, bytes);
  if (!imported.ok()) {
    return imported.status().with_context("importing a " + format_bytes(bytes) + " handle");
  }
  if (governor_ != nullptr) {
    Status charged = grant->charge(bytes);
    if (!charged.ok()) {
      driver_.release(*imported).ignore();
      return charged;
    }
  }
  MutexLock lock(mutex_);
  Entry entry{bytes, HandleState::kInUse, 0, ++next_epoch_};
  entry.crosses_processes = true;
  entries_.emplace(*imported, entry);
  ++counters_.creates;
  return imported;
}

Status HandlePool::share(Handle handle, std::size_t bytes, std::uint64_t epoch) {
  MutexLock lock(mutex_);
  auto it = entries_.find(handle);
  if (it == entries_.end() || it->second.state != HandleState::kInUse ||
      it->second.bytes != bytes) {
    const std::string state = it == entries_.end()
                                  ? "not known to the pool"
                                  : std::string(to_string(it->second.state)) + " with " +
                                        std::to_string(it->second.bytes) + " bytes";
    return Status::InvalidArgument("handle " + std::to_string(handle) + " is " + state +
                                   "; only a handle its owner holds can be shared");
  }
  if (epoch != 0 && it->second.epoch != epoch) {
    return Status::FailedPrecondition("handle " + std::to_string(handle) + " was reissued (epoch " +
                                      std::to_string(it->second.epoch) + ", the reference names " +
                                      std::to_string(epoch) +
                                      "): its content is no longer the one referenced");
  }
  ++it->second.mappings;
  return Status::Ok();
}

void HandlePool::hold(Handle handle) {
  MutexLock lock(mutex_);
  auto it = entries_.find(handle);
  KVVM_CHECK(it != entries_.end() && it->second.state == HandleState::kInUse,
             "hold of handle " + std::to_string(handle) + " that is not in use");
  ++it->second.holds;
}

void HandlePool::unhold(Handle handle, Disposition disposition) {
  std::size_t release_bytes = 0;
  {
    MutexLock lock(mutex_);
    auto it = entries_.find(handle);
    KVVM_CHECK(it != entries_.end() && it->second.holds > 0,
               "unhold of handle " + std::to_string(handle) + " with no hold");
    Entry& entry = it->second;
    if (--entry.holds > 0 || entry.mappings > 0 || entry.state != HandleState::kInUse) return;
    if (return_locked(handle, entry, disposition)) {
      release_bytes = entry.bytes;
      entries_.erase(it);
    }
  }
  if (release_bytes > 0) release_now(handle, release_bytes);
}

void HandlePool::reissue(Handle handle) {
  MutexLock lock(mutex_);
  auto it = entries_.find(handle);
  KVVM_CHECK(it != entries_.end() && it->second.state == HandleState::kInUse,
             "reissue of handle " + std::to_string(handle) + " that is not in use");
  it->second.epoch = ++next_epoch_;
}

void HandlePool::note_mapped(Handle handle) {
  MutexLock lock(mutex_);
  auto it = entries_.find(handle);
  KVVM_CHECK(it != entries_.end() && it->second.state != HandleState::kPooled,
             "note_mapped on handle " + std::to_string(handle) + " that is not in use");
  ++it->second.mappings;
}

bool HandlePool::return_locked(Handle handle, Entry& entry, Disposition disposition) {
  // Another process may map it: never handed out again as fresh memory.
  if (disposition == Disposition::kRelease || entry.crosses_processes) return true;
  std::uint64_t pooled = 0;
  for (const auto& [size, list] : pooled_) pooled += size * list.size();
  if (pooled + entry.bytes > options_.max_pooled_bytes) return true;
  entry.state = HandleState::kPooled;
  pooled_[entry.bytes].push_back(handle);
  return false;
}

void HandlePool::note_unmapped(Handle handle, Disposition disposition) {
  std::size_t release_bytes = 0;
  {
    MutexLock lock(mutex_);
    auto it = entries_.find(handle);
    KVVM_CHECK(it != entries_.end() && it->second.mappings > 0,
               "note_unmapped on handle " + std::to_string(handle) + " with no mapping");
    Entry& entry = it->second;
    if (--entry.mappings > 0 || entry.holds > 0 || entry.state != HandleState::kInUse) return;
    if (return_locked(handle, entry, disposition)) {
      release_bytes = entry.bytes;
      entries_.erase(it);
    }
  }
  if (release_bytes > 0) release_now(handle, release_bytes);
}

void HandlePool::give_back(Handle handle, Disposition disposition) {
  std::size_t release_bytes = 0;
  {
    MutexLock lock(mutex_);
    auto it = entries_.find(handle);
    KVVM_CHECK(it != entries_.end() && it->second.state == HandleState::kInUse &&
                   it->second.mappings == 0 && it->second.holds == 0,
               "give_back of handle " + std::to_string(handle) + " that is not unmapped in use");
    if (return_locked(handle, it->second, disposition)) {
      release_bytes = it->second.bytes;
      entries_.erase(it);
    }
  }
  if (release_bytes > 0) release_now(handle, release_bytes);
}

void HandlePool::quarantine(Handle handle, std::string_view why) {
  MutexLock lock(mutex_);
  auto it = entries_.find(handle);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  if (entry.state == HandleState::kPooled) {
    auto& list = pooled_[entry.bytes];
    std::erase(list, handle);
  }
  if (entry.state != HandleState::kQuarantined) {
    log(LogLevel::kWarning, "quarantined handle " + std::to_string(handle) + " (" +
                                format_bytes(entry.bytes) + "): " + std::string(why));
  }
  entry.state = HandleState::kQuarantined;
}

bool HandlePool::release_now(Handle handle, std::size_t bytes) {
  Status released = driver_.release(handle);
  MutexLock lock(mutex_);
  if (released.ok()) {
    ++counters_.releases;
    counters_.released_bytes += bytes;
    if (governor_ != nullptr) governor_->return_bytes(tier_, bytes);
    return true;
  }
  // The driver may or may not still hold the memory: keep it charged, never reuse it.
  ++counters_.release_failures;
  entries_.emplace(handle, Entry{bytes, HandleState::kQuarantined, 0});
  log(LogLevel::kWarning, "release of handle " + std::to_string(handle) +
                              " failed, quarantined: " + released.to_string());
  return false;
}

std::uint64_t HandlePool::trim(std::uint64_t bytes) {
  std::uint64_t freed = 0;
  while (freed < bytes) {
    Handle handle = kNoHandle;
    std::size_t size = 0;
    {
      MutexLock lock(mutex_);
      for (auto& [bucket_size, list] : pooled_) {
        if (!list.empty()) {
          handle = list.back();
          list.pop_back();
          size = bucket_size;
          entries_.erase(handle);
          break;
        }
      }
    }
    if (handle == kNoHandle) break;
    if (release_now(handle, size)) freed += size;
  }
  return freed;
}

std::uint64_t HandlePool::released_bytes() const {
  MutexLock lock(mutex_);
  return counters_.released_bytes;
}

Result<HandleInfo> HandlePool::describe(Handle handle) const {
  MutexLock lock(mutex_);
  auto it = entries_.find(handle);
  if (it == entries_.end()) {
    return Status::InvalidArgument("handle " + std::to_string(handle) +
                                   " is not known to this pool");
  }
  const Entry& entry = it->second;
  return HandleInfo{handle,         entry.bytes, granule_,    entry.state,
                    entry.mappings, entry.epoch, entry.holds, entry.crosses_processes};
}

PoolSnapshot HandlePool::snapshot() const {
  MutexLock lock(mutex_);
  PoolSnapshot snapshot = counters_;
  for (const auto& [handle, entry] : entries_) {
    switch (entry.state) {
      case HandleState::kPooled:
        snapshot.pooled_bytes += entry.bytes;
        ++snapshot.handles_pooled;
        break;
      case HandleState::kInUse:
        snapshot.mapped_bytes += entry.bytes;
        ++snapshot.handles_in_use;
        break;
      case HandleState::kQuarantined:
        snapshot.quarantined_bytes += entry.bytes;
        ++snapshot.handles_quarantined;
        break;
      case HandleState::kReleased:
        break;
    }
  }
  snapshot.owned_bytes = snapshot.pooled_bytes + snapshot.mapped_bytes + snapshot.quarantined_bytes;
  return snapshot;
}

std::vector<HandleInfo> HandlePool::handles() const {
  MutexLock lock(mutex_);
  std::vector<HandleInfo> list;
  list.reserve(entries_.size());
  for (const auto& [handle, entry] : entries_) {
    list.push_back(HandleInfo{handle, entry.bytes, granule_, entry.state, entry.mappings,
                              entry.epoch, entry.holds, entry.crosses_processes});
  }
  return list;
}

}  // namespace kvvm
