// One side of a KV handoff in the tests: a host driver (exportable or not) behind a fault
// driver, a governor tier, a pool and an arena of the small test geometry; plus the byte
// pattern the sender writes and both sides check.
#pragma once

#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvvm/kv/arena.h"
#include "kvvm/kv/kv_handoff.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "support/invariants.h"

namespace kvvm::testing {

struct HandoffSide {
  std::unique_ptr<Driver> real;
  std::unique_ptr<FaultDriver> fault;
  std::unique_ptr<Governor> governor;
  TierId tier = 0;
  std::unique_ptr<HandlePool> pool;
  std::unique_ptr<Arena> arena;

  ~HandoffSide() {
    arena.reset();
    pool.reset();
  }
  std::size_t granule() const { return real->granule(); }
  World world() const {
    return World{fault.get(), real.get(), pool.get(), governor.get(), tier, arena->reservations()};
  }
  std::uint64_t used() const { return governor->stats(tier).used; }
};

struct HandoffSideOptions {
  bool exportable = true;
  std::size_t granule = 0;  // 0: the page size
  Layout layout = Layout::kTokenMajor;
  DType dtype = DType::kFp16;
  std::size_t budget_granules = 256;
};

// Every failure here is the test's setup, not what it checks: a status the caller asserts.
inline Result<std::unique_ptr<HandoffSide>> make_handoff_side(HandoffSideOptions options = {}) {
  auto side = std::make_unique<HandoffSide>();
  KVVM_ASSIGN_OR_RETURN(
      side->real, make_host_driver(HostDriverOptions{.granule = options.granule,
                                                     .exportable_handles = options.exportable}));
  side->fault = std::make_unique<FaultDriver>(*side->real);
  side->governor = std::make_unique<Governor>();
  const std::size_t g = side->real->granule();
  side->tier = side->governor->add_tier("kv", options.budget_granules * g);
  // Nothing pooled: every released handle goes back, so the ledger shows exactly what is held.
  side->pool = std::make_unique<HandlePool>(*side->fault, PoolOptions{.max_pooled_bytes = 0},
                                            side->governor.get(), side->tier);
  // 1 KiB a token (2 layers, 2 KV heads, head dim 64, fp16): a page holds 4 tokens.
  const Geometry geometry{"handoff-test", 2, 2, 64, options.dtype};
  KVVM_ASSIGN_OR_RETURN(LayoutPlan plan, plan_layout(geometry, options.layout, g, 64 * g / 1024));
  KVVM_ASSIGN_OR_RETURN(side->arena, Arena::create(*side->pool, *side->governor,
                                                   ArenaOptions{plan, 4, side->tier, 0,
                                                                std::chrono::milliseconds(0)}));
  return side;
}

// The byte the sender writes at byte `i` of fragment `f` of its slot.
inline unsigned char handoff_byte(std::uint64_t f, std::uint64_t i) {
  return static_cast<unsigned char>((i * 7 + (i >> 10) * 131 + f * 13 + 5) & 0xff);
}

// The bytes of the first `tokens` tokens of every fragment of `slot`, as they should read.
inline std::vector<unsigned char> expected_bytes(const Arena& arena, std::uint64_t tokens) {
  const LayoutPlan& plan = arena.plan();
  std::vector<unsigned char> bytes;
  for (std::uint64_t f = 0; f < plan.fragments; ++f) {
    for (std::uint64_t i = 0; i < tokens * plan.contiguous_bytes_per_token; ++i) {
      bytes.push_back(handoff_byte(f, i));
    }
  }
  return bytes;
}

// What the first `tokens` tokens of `slot` hold, read straight from memory (no driver copy).
inline std::vector<unsigned char> read_tokens(const Arena& arena, SlotId slot,
                                              std::uint64_t tokens) {
  const LayoutPlan& plan = arena.plan();
  std::vector<unsigned char> bytes;
  for (std::uint64_t f = 0; f < plan.fragments; ++f) {
    const auto* at =
        reinterpret_cast<const unsigned char*>(arena.slot_base(slot) + f * plan.fragment_stride);
    bytes.insert(bytes.end(), at, at + tokens * plan.contiguous_bytes_per_token);
  }
  return bytes;
}

// Admits a sequence of `tokens` tokens and writes the pattern into them.
inline Result<SlotId> admit_with_pattern(HandoffSide& side, std::uint64_t tokens) {
  KVVM_ASSIGN_OR_RETURN(SlotId slot, side.arena->admit(tokens));
  const LayoutPlan& plan = side.arena->plan();
  const std::vector<unsigned char> bytes = expected_bytes(*side.arena, tokens);
  const std::size_t per_fragment = tokens * plan.contiguous_bytes_per_token;
  for (std::uint64_t f = 0; f < plan.fragments; ++f) {
    KVVM_RETURN_IF_ERROR(side.real->write(side.arena->slot_base(slot) + f * plan.fragment_stride,
                                          bytes.data() + f * per_fragment, per_fragment));
  }
  return slot;
}

// A connected SOCK_SEQPACKET pair; {-1, -1} on failure.
inline std::pair<int, int> seqpacket_pair() {
  int fds[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return {-1, -1};
  return {fds[0], fds[1]};
}

// Descriptors open in this process now.
inline std::size_t open_descriptors() {
  std::size_t count = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (::readdir(dir) != nullptr) ++count;
    ::closedir(dir);
  }
  return count;
}

}  // namespace kvvm::testing
