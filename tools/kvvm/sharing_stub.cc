// TEMPORARY (remove when main's Arena sharing lands): weak stand-ins so the simulator links
// before Arena::publish / admit_shared and SharedPrefix::usable are defined.
#include "kvvm/arena.h"

namespace kvvm {

__attribute__((weak)) Result<std::shared_ptr<SharedPrefix>> Arena::publish(SlotId, std::uint64_t) {
  return Status::FailedPrecondition("sharing is not implemented in this build");
}
__attribute__((weak)) Result<SlotId> Arena::admit_shared(const SharedPrefix&, std::uint64_t,
                                                         Stream) {
  return Status::FailedPrecondition("sharing is not implemented in this build");
}
__attribute__((weak)) bool SharedPrefix::usable() const { return false; }

}  // namespace kvvm
