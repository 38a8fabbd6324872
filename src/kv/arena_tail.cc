// The arena's dummy tail page (see arena.h): one zeroed read-only granule mapped over every
// uncommitted window of a slot up to the padded length, so a kernel reading a padded shape
// reads zeros instead of faulting.
#include <algorithm>
#include <vector>

#include "kvvm/arena.h"

namespace kvvm {

std::uint64_t Arena::padded_windows() const {
  return dummy_.handle == kNoHandle ? 0
                                    : options_.plan.windows_per_fragment(options_.padded_tokens);
}

Status Arena::map_dummy(SlotId slot, std::uint64_t from, std::uint64_t to) {
  std::vector<std::size_t> mapped;
  for (const Range& range : window_ranges(slot, from, to)) {
    for (std::size_t at = range.offset; at < range.offset + range.len;
         at += options_.plan.granule) {
      Status status = reservation_->map_shared(at, dummy_, Access::kReadOnly);
      if (!status.ok()) {
        for (std::size_t offset : mapped) {
          (void)reservation_->release(offset, options_.plan.granule);  // poisons on failure
        }
        return status;
      }
      mapped.push_back(at);
    }
  }
  return Status::Ok();
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
  KVVM_RETURN_IF_ERROR(map_dummy(slot, from, to));
  std::lock_guard lock(mutex_);
  Slot& s = slots_[slot];
  if (s.dummy_to <= s.dummy_from) s.dummy_to = to;
  s.dummy_from = from;
  return Status::Ok();
}

}  // namespace kvvm
