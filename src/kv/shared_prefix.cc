// SharedPrefix: see shared_prefix.h. A prefix never owns memory itself: its windows live as
// long as some slot maps them (the pool's mapping counts), so all it checks is that each
// handle is still the issue it recorded, and it keeps the list of sequences that can serve
// the boundary bytes.
#include "kvvm/shared_prefix.h"

#include <algorithm>

#include "kvvm/arena.h"

namespace kvvm {

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
    return source.arena->source_valid(source.slot, source.occupancy);
  });
}

void SharedPrefix::add_source(Source source) const {
  std::lock_guard lock(mutex_);
  sources_.push_back(source);
}

void SharedPrefix::drop_source(const Arena* arena, std::uint32_t slot) const {
  std::lock_guard lock(mutex_);
  std::erase_if(sources_, [&](const Source& s) { return s.arena == arena && s.slot == slot; });
}

std::vector<SharedPrefix::Source> SharedPrefix::sources() const {
  std::lock_guard lock(mutex_);
  return sources_;
}

}  // namespace kvvm
