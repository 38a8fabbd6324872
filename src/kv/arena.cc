// Arena: see arena.h. The public contract, forwarding to the state behind it: the slot table
// and a sequence's lifecycle are ArenaState's (arena_state.h), the sharing decisions
// PrefixSharing's (prefix_sharing.h), and the parts with no slot state (DummyTail, CopyOnWrite,
// CommitAhead) classes of their own. Each forwarder is one non-virtual call: the decode path
// (ensure) and view() gain no allocation and no dispatch.
#include "kvvm/kv/arena.h"

#include <limits>
#include <string>

#include "kv/arena_state.h"
#include "kv/copy_on_write.h"
#include "kv/dummy_tail.h"
#include "kv/prefix/prefix_sharing.h"

namespace kvvm {
namespace {

// More sequences than any engine runs at once; the slot table is allocated up front.
constexpr std::uint32_t kMaxSlots = 1u << 20;

}  // namespace

Result<std::unique_ptr<Arena>> Arena::create(HandlePool& pool, Governor& governor,
                                             ArenaOptions options) {
  const LayoutPlan& plan = options.plan;
  if (plan.granule != pool.granule()) {
    return Status::InvalidArgument("arena plan granule " + std::to_string(plan.granule) +
                                   " differs from the driver's granule " +
                                   std::to_string(pool.granule()));
  }
  if (options.max_slots == 0 || options.max_slots > kMaxSlots) {
    return Status::InvalidArgument("arena with " + std::to_string(options.max_slots) +
                                   " slots: between 1 and " + std::to_string(kMaxSlots));
  }
  if (plan.slot_stride == 0 || plan.fragments == 0) {
    return Status::InvalidArgument("arena plan has a zero slot stride (plan_layout not run?)");
  }
  if (plan.slot_stride > std::numeric_limits<std::uint64_t>::max() / options.max_slots) {
    return Status::InvalidArgument(std::to_string(options.max_slots) + " slots of " +
                                   std::to_string(plan.slot_stride) +
                                   " bytes overflow the address space");
  }
  if (options.padded_tokens > plan.max_context) {
    return Status::InvalidArgument("padded length " + std::to_string(options.padded_tokens) +
                                   " tokens is beyond the max context of " +
                                   std::to_string(plan.max_context));
  }
  const std::uint64_t bytes = plan.slot_stride * options.max_slots;
  Result<std::unique_ptr<Reservation>> reservation = Reservation::create(pool, bytes);
  if (!reservation.ok()) {
    return reservation.status().with_context("arena of " + std::to_string(options.max_slots) +
                                             " slots x " + std::to_string(plan.slot_stride) +
                                             " bytes (too many slots for the address space?)");
  }
  std::unique_ptr<DummyTail> dummy;
  if (options.padded_tokens > 0) {
    KVVM_ASSIGN_OR_RETURN(auto made,
                          DummyTail::create(pool, governor, options.tier, options.budget_wait));
    dummy = std::move(made);
  }
  auto cow =
      CopyOnWrite::create(pool, governor, options.tier, options.max_slots, options.budget_wait);
  if (!cow.ok()) return cow.status().with_context("arena");
  return std::unique_ptr<Arena>(new Arena(std::make_unique<ArenaState>(
      pool, governor, std::move(options), std::move(reservation).value(), std::move(dummy),
      std::move(cow).value())));
}

Arena::Arena(std::unique_ptr<ArenaState> state) : state_(std::move(state)) {}

Arena::~Arena() = default;

Result<SlotId> Arena::admit(std::uint64_t tokens) { return state_->admit(tokens); }

Status Arena::ensure(SlotId slot, std::uint64_t tokens, Stream stream) {
  return state_->ensure(slot, tokens, stream);
}

Status Arena::rewind(SlotId slot, std::uint64_t tokens) { return state_->rewind(slot, tokens); }

Result<std::shared_ptr<SharedPrefix>> Arena::publish(SlotId slot, std::uint64_t prefix_tokens) {
  return state_->sharing_->publish(slot, prefix_tokens);
}

Result<SlotId> Arena::admit_shared(const SharedPrefix& prefix, std::uint64_t tokens,
                                   Stream stream) {
  return state_->sharing_->admit_shared(prefix, tokens, stream);
}

Result<SlotId> Arena::fork(SlotId parent, std::uint64_t position, Stream stream) {
  return state_->sharing_->fork(parent, position, stream);
}

Status Arena::finish(SlotId slot, Stream stream) { return state_->finish(slot, stream); }

Status Arena::release(SlotId slot, Stream stream) { return state_->release(slot, stream); }

std::uint64_t Arena::reclaim(std::uint64_t bytes) { return state_->reclaim(bytes); }

Result<std::vector<HandleInfo>> Arena::seal_windows(SlotId slot, std::uint64_t from,
                                                    std::uint64_t to,
                                                    std::vector<std::uint64_t>* newly) {
  return state_->sharing_->seal_windows(slot, from, to, newly);
}

Arena::CaptureGuard Arena::begin_capture() {
  state_->begin_capture();
  return CaptureGuard(this);
}

Arena::CaptureGuard::~CaptureGuard() {
  if (arena_ != nullptr) arena_->state_->end_capture();
}

Address Arena::slot_base(SlotId slot) const { return state_->slot_base(slot); }

std::uint64_t Arena::tokens(SlotId slot) const { return state_->tokens(slot); }

KvView Arena::view() const { return state_->options_.plan.view(state_->reservation_->base()); }

const LayoutPlan& Arena::plan() const { return state_->options_.plan; }

HandlePool& Arena::pool() const { return state_->pool_; }

TierId Arena::tier() const { return state_->options_.tier; }

const Reservation& Arena::reservation() const { return *state_->reservation_; }

std::vector<const Reservation*> Arena::reservations() const { return state_->reservations(); }

ArenaStats Arena::stats() const { return state_->stats(); }

void Arena::wait_until_idle() { state_->wait_until_idle(); }

}  // namespace kvvm
