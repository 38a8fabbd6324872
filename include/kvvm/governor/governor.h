// The governor: budgets per tier, grants, FIFO admission and reclaim before refusal.
//
// Every byte of physical memory kvvm owns is charged to a tier. Before a commit, the caller
// takes a Grant (bytes set aside, not yet owned); as handles are created the grant is
// charged (set-aside bytes become used bytes); committing the grant settles it and gives
// back what was not used; dropping it gives back everything not charged. So at every
// moment used + reserved <= limit, and a tier's used bytes equal what its holders own.
//
// When a request does not fit, the governor first asks the tier's reclaimers (the handle
// pool's trim; later the arena's reclaimable windows) to give memory back, and only then
// waits (FIFO behind earlier waiters) or refuses with ResourceExhausted carrying
// requested / available / limit: exhaustion is backpressure, never a crash.
//
// Thread-safety: all calls are thread-safe. Lock order: Governor::mutex_ is a leaf lock;
// reclaimers are called without it held, so they may call return_bytes().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvvm/base/mutex.h"
#include "kvvm/base/status.h"

namespace kvvm {

using TierId = std::size_t;

struct TierStats {
  std::string name;
  std::uint64_t limit = 0;
  std::uint64_t used = 0;            // bytes holders own (charged)
  std::uint64_t reserved = 0;        // bytes set aside by open grants, not yet charged
  std::uint64_t peak = 0;            // highest used + reserved seen
  std::uint64_t grants = 0;          // grants handed out
  std::uint64_t refusals = 0;        // prepare() calls refused with ResourceExhausted
  std::uint64_t reclaimed = 0;       // bytes reclaimers reported giving back
  std::size_t waiting = 0;           // prepare() calls queued now
  std::uint64_t excess_returns = 0;  // return_bytes() calls that gave back more than was used
                                     // (a holder's bug; clamped and reported to the log sink)
};

class Governor;
namespace testing {
struct GovernorTestAccess;  // the tests' seam to Governor's test-only calls
}  // namespace testing

// Bytes set aside in one tier for one commit. Move-only; dropping it rolls back whatever
// was not charged.
class [[nodiscard]] Grant {
 public:
  Grant() = default;
  Grant(Grant&& other) noexcept;
  Grant& operator=(Grant&& other) noexcept;
  Grant(const Grant&) = delete;
  Grant& operator=(const Grant&) = delete;
  ~Grant();

  TierId tier() const { return tier_; }
  std::uint64_t prepared() const { return prepared_; }
  std::uint64_t charged() const { return charged_; }
  std::uint64_t remaining() const { return prepared_ - charged_; }
  bool active() const { return governor_ != nullptr; }

  // Turns `bytes` of the set-aside into used bytes now (a handle was created).
  // ResourceExhausted when fewer than `bytes` remain in the grant; nothing changes then.
  Status charge(std::uint64_t bytes);

  // Settles the grant at `actual` bytes (>= charged, <= prepared): used becomes charged
  // plus (actual - charged), the rest goes back. The grant is inactive afterwards.
  Status commit(std::uint64_t actual);
  // Settles at what was charged.
  void commit_charged();

 private:
  friend class Governor;
  Grant(Governor* governor, TierId tier, std::uint64_t bytes)
      : governor_(governor), tier_(tier), prepared_(bytes) {}
  void settle(std::uint64_t actual);

  Governor* governor_ = nullptr;
  TierId tier_ = 0;
  std::uint64_t prepared_ = 0;
  std::uint64_t charged_ = 0;
};

// Called when a tier is short: give back up to `wanted` bytes (through return_bytes) and
// report how many were given back. Must not call prepare() on the same governor.
using Reclaimer = std::function<std::uint64_t(std::uint64_t wanted)>;

class Governor {
 public:
  Governor() = default;
  Governor(const Governor&) = delete;
  Governor& operator=(const Governor&) = delete;
  // REQUIRES: no open grants and no registered reclaimers.
  ~Governor() = default;

  TierId add_tier(std::string name, std::uint64_t limit);

  // Sets aside `bytes` in `tier`. When they do not fit: runs the tier's reclaimers, then
  // waits up to `wait` in FIFO order behind earlier callers, then refuses with
  // ResourceExhausted (requested, available, limit). wait == 0: never blocks.
  // Only the head of the queue runs reclaimers (on reaching the head short of bytes, and once
  // more at its deadline before refusing); a later call never overtakes a queued one, so with
  // wait == 0 and a non-empty queue it is refused at once. bytes == 0: an empty grant;
  // bytes > limit: refused at once. Unknown tier: InvalidArgument.
  Result<Grant> prepare(TierId tier, std::uint64_t bytes,
                        std::chrono::milliseconds wait = std::chrono::milliseconds(0));

  // A holder gave back `bytes` it owned (a handle was released).
  void return_bytes(TierId tier, std::uint64_t bytes);

  // Registers a reclaimer for `tier`; it stays registered until the returned token dies.
  // Destroying the token waits for a run of the reclaimer in progress on another thread, so
  // REQUIRES: the token is not destroyed while holding a lock the reclaimer takes.
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&&) noexcept;
    Registration& operator=(Registration&&) noexcept;
    ~Registration();

   private:
    friend class Governor;
    Registration(Governor* g, std::uint64_t id) : governor_(g), id_(id) {}
    Governor* governor_ = nullptr;
    std::uint64_t id_ = 0;
  };
  [[nodiscard]] Registration add_reclaimer(TierId tier, Reclaimer reclaimer);

  TierStats stats(TierId tier) const;
  std::size_t tier_count() const;

 private:
  friend class Grant;
  friend struct testing::GovernorTestAccess;
  struct Tier {
    TierStats stats;
    std::deque<std::uint64_t> queue;  // tickets of waiting prepare() calls, FIFO
  };
  struct ReclaimerEntry {
    std::uint64_t id;
    TierId tier;
    std::shared_ptr<Reclaimer> reclaimer;
    std::thread::id runner;  // the thread inside this reclaimer now; default: none
  };

  void settle(TierId tier, std::uint64_t prepared, std::uint64_t charged, std::uint64_t actual)
      KVVM_EXCLUDES(mutex_);
  Status charge(TierId tier, std::uint64_t bytes);  // from a grant: reserved -> used
  // Tests only (through testing::GovernorTestAccess): takes ownership of bytes without a
  // grant, so a test can fill a tier in one call. REQUIRES used + reserved + bytes <= limit,
  // else ResourceExhausted and nothing changes.
  Status charge_direct(TierId tier, std::uint64_t bytes);
  void remove_reclaimer(std::uint64_t id);
  // Only the head of the tier's queue calls it, with the lock let go: reclaimers take it.
  std::uint64_t run_reclaimers(TierId tier, std::uint64_t wanted) KVVM_EXCLUDES(mutex_);
  Status check_tier(TierId tier) const KVVM_REQUIRES(mutex_);

  mutable Mutex mutex_;
  std::condition_variable changed_;
  std::vector<Tier> tiers_ KVVM_GUARDED_BY(mutex_);
  std::vector<ReclaimerEntry> reclaimers_ KVVM_GUARDED_BY(mutex_);
  std::uint64_t next_ticket_ KVVM_GUARDED_BY(mutex_) = 1;
  std::uint64_t next_reclaimer_ KVVM_GUARDED_BY(mutex_) = 1;
};

}  // namespace kvvm
