// Reservation: one virtual address range, reserved once, with physical memory committed and
// released under it as transactions.
//
// Address and memory are separate: the base address is fixed for the reservation's life;
// commit maps handles under it, release unmaps them and keeps the addresses (so the same
// window can be committed again without reserving), and only the destructor frees the range.
//
// commit(offset, len) is one transaction (invariant 3, docs/ARCHITECTURE.md "Invariants"): it takes
// every handle first (from the pool, else created inside the caller's grant), then maps them and
// sets access once over the range. On any failure it unmaps this transaction's mappings in reverse
// order and gives their handles back; a block whose unmap fails stays recorded as mapped, is
// poisoned (its handle quarantined: never reused, still charged) and is reported as residual.
//
// The destructor calls the teardown synchronizer first. If that fails, nothing is unmapped,
// released or freed: the memory is deliberately leaked (a kernel may still read it), counted
// in teardown_stats() and reported once to the log sink. It never throws and never asserts on a
// driver error.
//
// Thread-safety: calls on disjoint ranges may run concurrently (a scheduler growing one
// sequence while a background worker commits ahead for another). Each call claims its ranges
// under mutex_, makes its driver calls without it, then publishes; a call whose range
// overlaps one in flight is refused with Unavailable and changes nothing. Lock order:
// Reservation::mutex_ is a leaf (no pool, governor or driver call is made while it is held).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvvm/base/mutex.h"
#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/handle_pool.h"

namespace kvvm {

struct ReservationOptions {
  // Called before teardown; default: driver.synchronize(). A failure means a kernel may
  // still read the memory, so it is leaked rather than unmapped.
  std::function<Status()> teardown_synchronizer;
};

// A granule-aligned range of a reservation, in bytes from its base.
struct Range {
  std::size_t offset = 0;
  std::size_t len = 0;
};

struct CommitOptions {
  Access access = Access::kReadWrite;
  // Bytes per handle (a multiple of the granule); 0: one granule per handle. Larger handles
  // make fewer driver calls; the pool keeps handles by size.
  std::size_t handle_bytes = 0;
};

// One mapping: a handle (or a granule-aligned sub-range of one) mapped at an offset.
struct Block {
  std::size_t offset = 0;  // from the reservation's base
  std::size_t bytes = 0;
  Handle handle = kNoHandle;
  std::size_t handle_offset = 0;
  Access access = Access::kNone;
  bool shared = false;    // mapped by map_shared: another owner's handle
  bool poisoned = false;  // an unmap failed: state unknown; never reused
};

// Process-wide counts of deliberate leaks at teardown (invariant 6, docs/ARCHITECTURE.md
// "Invariants").
struct TeardownStats {
  std::uint64_t leaked_reservations = 0;  // teardown synchronization failed
  std::uint64_t leaked_blocks = 0;        // left mapped (poisoned, or their unmap failed)
  std::uint64_t leaked_bytes = 0;
  std::uint64_t leaked_address_bytes = 0;  // ranges not freed
  std::uint64_t free_failures = 0;
};
TeardownStats teardown_stats();
// For tests: start counting from zero.
void reset_teardown_stats();

class Reservation {
 public:
  // Reserves `bytes` (a positive multiple of the pool's granule) of addresses on the pool's
  // driver. InvalidArgument for a bad size; DriverError when the driver refuses.
  static Result<std::unique_ptr<Reservation>> create(HandlePool& pool, std::size_t bytes,
                                                     ReservationOptions options = {});
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation();

  Address base() const { return base_; }
  std::size_t size() const { return size_; }
  std::size_t granule() const { return granule_; }

  // Commits [offset, offset + len): both multiples of the granule, inside the reservation,
  // no window already mapped. `grant` pays for handles that must be created (may be null
  // when the pool has no governor).
  Status commit(std::size_t offset, std::size_t len, Grant* grant, CommitOptions options = {});
  // Commits several disjoint ranges as one transaction (the fragments of a sequence): every
  // handle first, then every map, then one set_access per range; on failure all of it is
  // rolled back as for commit().
  Status commit_ranges(const std::vector<Range>& ranges, Grant* grant, CommitOptions options = {});

  // Unmaps every block in [offset, offset + len) (every window must be mapped, blocks must
  // lie wholly inside), coalescing adjacent blocks into one unmap; returns the handles
  // (the pool keeps or releases them); keeps the addresses.
  Status release(std::size_t offset, std::size_t len, Disposition disposition = Disposition::kKeep);

  // Puts `fresh` (an in-use handle of the same size the caller holds) in place of the one
  // block mapped at `offset`, with `access`: unmap, map, set access (copy-on-write's remap).
  // On failure the old handle is mapped back with its old access; if even that fails the
  // window is left unmapped and the error says so. On success the old handle loses this
  // mapping (its other mappings keep it) and `fresh` gains one.
  Status replace(std::size_t offset, Handle fresh, Access access);

  // Maps another owner's handle (described by the pool; its epoch, when set, must still be
  // current) (or the granule-aligned part [handle_offset, handle_offset +
  // bytes) of it; bytes 0: to its end) at `offset`, read-only by default. If set_access fails
  // the mapping is withdrawn and the handle stays with its owner.
  Status map_shared(std::size_t offset, const HandleInfo& handle, Access access = Access::kReadOnly,
                    std::size_t handle_offset = 0, std::size_t bytes = 0);

  // One whole handle of another owner and where map_shared_many maps it.
  struct SharedMapping {
    std::size_t offset = 0;
    HandleInfo handle;
  };
  // map_shared of many whole handles as one transaction (a prefix's windows, admitted as a
  // sharer): every check first (a refused call maps nothing), then every share and map, then
  // one set_access per run of contiguous offsets — the driver call that costs most per window —
  // instead of one per handle. On any failure every mapping made is withdrawn (the handles stay
  // with their owners, counted as before); a block whose withdrawing unmap fails too is
  // poisoned and named, as for map_shared.
  Status map_shared_many(const std::vector<SharedMapping>& mappings,
                         Access access = Access::kReadOnly);

  // Changes the access of the mapped windows in [offset, offset + len).
  Status set_access(std::size_t offset, std::size_t len, Access access);

  std::vector<Block> blocks() const;
  // The block mapping `offset`, if any. REQUIRES: no call on this reservation is in flight on
  // another thread (the pointer is into the table).
  const Block* block_at(std::size_t offset) const;
  // Copies of the blocks starting in [offset, offset + len), in order.
  std::vector<Block> blocks_in(std::size_t offset, std::size_t len) const;
  std::uint64_t mapped_bytes() const;
  std::uint64_t residual_bytes() const;  // poisoned blocks
  // Physical bytes under the reservation: each handle mapped here counted once, with the size
  // of its first block here (blocks of one handle all have one size where sharing is by
  // granule, as in the arena), leaving out `excluded`. Kept as blocks come and go: no
  // per-block work.
  std::uint64_t distinct_handle_bytes(Handle excluded = kNoHandle) const;
  // How many blocks here map `handle` (0: none).
  std::uint64_t mappings_of(Handle handle) const;

 private:
  Reservation(HandlePool& pool, Address base, std::size_t size, ReservationOptions options);
  // InvalidArgument unless [offset, offset + len) is a non-empty granule-aligned range
  // inside the reservation.
  Status check_range(std::string_view what, std::size_t offset, std::size_t len) const;
  // InvalidArgument when any window of the range is already mapped; Unavailable when it
  // overlaps a range in flight.
  Status check_unmapped(std::string_view what, std::size_t offset, std::size_t len) const
      KVVM_REQUIRES(mutex_);
  // InvalidArgument (FailedPrecondition for poisoned blocks) unless every window of the range
  // is mapped by blocks lying wholly inside it; Unavailable when it overlaps a range in flight.
  Status check_covered(std::string_view what, std::size_t offset, std::size_t len) const
      KVVM_REQUIRES(mutex_);
  Status check_not_pending(std::string_view what, std::size_t offset, std::size_t len) const
      KVVM_REQUIRES(mutex_);
  // Claims the ranges (no longer pending once unclaim() ran).
  void unclaim(const std::vector<Range>& ranges);
  // One handle a transaction took, and whether the transaction created it.
  struct Taken {
    Handle handle = kNoHandle;
    bool created = false;
  };
  // Undoes a failed transaction: unmaps `mapped` (whose handles are taken[0..mapped.size()))
  // in reverse order, then gives every taken handle back: pool hits to the pool, handles the
  // transaction created released, so the ledger is exactly as before. Blocks whose unmap
  // fails are poisoned and described in the returned text (empty when nothing stayed behind).
  std::string roll_back(const std::vector<Block>& mapped, const std::vector<Taken>& taken);
  // Unmaps the covered range [offset, offset + len) in one driver call, falling back to one
  // call per block when that fails; released blocks leave the table, blocks whose own unmap
  // fails are poisoned. Returns the failed blocks' description (empty on success).
  std::string unmap_covered(std::size_t offset, std::size_t len,
                            Disposition disposition = Disposition::kKeep);
  // Records `block` as mapped in an unknown state and quarantines its handle.
  void poison(Block block) KVVM_EXCLUDES(mutex_);
  // The only ways blocks_ changes, so the running totals below stay true.
  // Inserts, or overwrites the block at its offset.
  void put_block(const Block& block) KVVM_REQUIRES(mutex_);
  void erase_block(std::size_t offset) KVVM_REQUIRES(mutex_);

  // Per handle mapped here: how many blocks map it and the bytes it counts for.
  struct HandleUse {
    std::uint64_t blocks = 0;
    std::uint64_t bytes = 0;
  };

  HandlePool& pool_;
  Driver& driver_;
  const Address base_;
  const std::size_t size_;
  const std::size_t granule_;
  ReservationOptions options_;
  mutable Mutex mutex_;
  std::map<std::size_t, Block> blocks_ KVVM_GUARDED_BY(mutex_);  // by offset
  // Ranges claimed by calls in flight.
  std::map<std::size_t, std::size_t> pending_ KVVM_GUARDED_BY(mutex_);
  std::unordered_map<Handle, HandleUse> handle_use_ KVVM_GUARDED_BY(mutex_);
  std::uint64_t mapped_bytes_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint64_t residual_bytes_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint64_t distinct_bytes_ KVVM_GUARDED_BY(mutex_) = 0;
};

}  // namespace kvvm
