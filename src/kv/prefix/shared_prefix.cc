// SharedPrefix: see shared_prefix.h. A prefix never owns memory itself: its windows live as
// long as some slot maps them (the pool's mapping counts), so all it checks is that each
// handle is still the issue it recorded, and it keeps the list of sequences that can serve
// the boundary bytes.
#include "kvvm/kv/prefix/shared_prefix.h"

#include <algorithm>

namespace kvvm {

std::shared_ptr<SharedPrefix> SharedPrefix::create(const HandlePool& pool, LayoutPlan plan,
                                                   SharedPrefixInfo info,
                                                   std::vector<HandleInfo> handles) {
  // The constructor is private (a prefix lives in a shared_ptr: enable_shared_from_this).
  return std::shared_ptr<SharedPrefix>(
      new SharedPrefix(pool, std::move(plan), info, std::move(handles)));
}

bool SharedPrefix::windows_intact() const {
  for (const HandleInfo& recorded : handles_) {
    Result<HandleInfo> now = pool_->describe(recorded.handle);
    if (!now.ok() || now->state != HandleState::kInUse || now->epoch != recorded.epoch ||
        (now->mappings == 0 && now->holds == 0)) {
      return false;
    }
  }
  return true;
}

bool SharedPrefix::usable() const {
  if (!windows_intact()) return false;
  if (info_.boundary_bytes == 0) return true;
  const std::vector<Source> list = sources();
  return std::any_of(list.begin(), list.end(), [](const Source& source) {
    return source.holder->holds(source.slot, source.occupancy);
  });
}

void SharedPrefix::add_source(Source source) const {
  MutexLock lock(mutex_);
  sources_.push_back(source);
}

void SharedPrefix::drop_source(const BoundaryHolder* holder, std::uint32_t slot) const {
  MutexLock lock(mutex_);
  std::erase_if(sources_, [&](const Source& s) { return s.holder == holder && s.slot == slot; });
}

std::vector<SharedPrefix::Source> SharedPrefix::sources() const {
  MutexLock lock(mutex_);
  return sources_;
}

}  // namespace kvvm
