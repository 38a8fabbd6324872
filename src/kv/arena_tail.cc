// The arena's dummy tail (see arena.h and dummy_tail.h): which windows of a slot the dummy
// page covers. Growth replaces covered windows (commit_windows); reclaim covers them again.
#include <algorithm>

#include "kv/dummy_tail.h"
#include "kvvm/arena.h"

namespace kvvm {

std::uint64_t Arena::padded_windows() const {
  return dummy_ ? options_.plan.windows_per_fragment(options_.padded_tokens) : 0;
}

Status Arena::cover_tail(SlotId slot, std::uint64_t from) {
  const std::uint64_t padded = padded_windows();
  std::uint64_t to = padded;
  {
    std::lock_guard lock(mutex_);
    const Slot& s = slots_[slot];
    if (s.dummy_to > s.dummy_from) to = std::min(padded, s.dummy_from);
  }
  if (from >= to) return Status::Ok();
  KVVM_RETURN_IF_ERROR(dummy_->map(*reservation_, window_ranges(slot, from, to)));
  std::lock_guard lock(mutex_);
  Slot& s = slots_[slot];
  SlotEdit edit(*this, s);
  if (s.dummy_to <= s.dummy_from) s.dummy_to = to;
  s.dummy_from = from;
  return Status::Ok();
}

}  // namespace kvvm
