// CopyOnWrite: makes a read-only granule of a reservation writable without disturbing the
// others who map the same handle.
//
// When no one else maps the handle it is switched to read-write in place. Otherwise a fresh
// handle (paid for under a grant) must receive the old bytes before it replaces the old
// mapping, and the old mapping is the only address sure to stay valid (other sharers may
// leave at any time): so the fresh handle is mapped at a scratch window of its own, the copy
// runs on the caller's stream, a fence is waited for, and Reservation::replace swaps the
// mappings in one step with its own rollback.
//
// A copy whose fence fails (not recorded, or the wait refused) may still be running: its
// completion is unknown. Then the fresh handle stays mapped at the lane's scratch window, held
// and charged (the copy writes it), and the lane is unsettled: counted in unsettled(), and
// settled by a later fence on the copy's stream that completes (settle(), tried first by the
// lane's next copy and at its slot's finish) or, failing that, by a whole-device
// synchronization at teardown (else the handle is quarantined and the mapping left to the
// scratch reservation's teardown). The window being made writable keeps its old mapping,
// which the copy reads, so nothing the copy touches is unmapped before it is known to be done.
//
// Thread-safety: calls with different lanes (scratch windows) may run concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

#include "kvvm/base/mutex.h"
#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/reservation.h"

namespace kvvm {

class CopyOnWrite {
 public:
  enum class Outcome { kAlreadyWritable, kInPlace, kCopied };

  // `lanes` scratch windows of one granule each; fresh handles are charged to `tier`, waiting
  // up to `wait` for budget.
  static Result<std::unique_ptr<CopyOnWrite>> create(HandlePool& pool, Governor& governor,
                                                     TierId tier, std::uint32_t lanes,
                                                     std::chrono::milliseconds wait);

  // The granule at `offset` of `target` (one healthy block) becomes read-write: in place when
  // its handle has no other mapping or hold and no other process may map it, else copied into a
  // fresh handle through scratch window `lane`. On failure the window keeps its old mapping (unless
  // `target` reports otherwise: see Reservation::replace) and no fresh handle stays charged.
  Result<Outcome> make_writable(Reservation& target, std::size_t offset, std::uint32_t lane,
                                Stream stream);

  // Lanes whose copy is still unconfirmed, and the bytes they keep mapped and charged.
  struct Unsettled {
    std::uint32_t lanes = 0;
    std::uint64_t bytes = 0;
  };
  Unsettled unsettled() const;
  // Whether `lane` holds a copy no fence has confirmed.
  bool unsettled(std::uint32_t lane) const;
  // Confirms `lane`'s unconfirmed copy with a fence on its stream and then lets its scratch
  // window and fresh handle go; OK when the lane has none. Unavailable, changing nothing, when
  // the fence fails again.
  Status settle(std::uint32_t lane);

  const Reservation& scratch() const { return *scratch_; }

  // Settles what it can (settle(), then a whole-device synchronization); a lane still
  // unconfirmed has its handle quarantined, and the scratch reservation's teardown synchronizes
  // before unmapping it (or leaks it).
  ~CopyOnWrite();

 private:
  // A copy queued through a lane that no fence confirmed.
  struct Pending {
    Handle fresh = kNoHandle;
    Disposition disposition = Disposition::kKeep;  // for the fresh handle once settled
    Stream stream = nullptr;
    bool settling = false;  // a settle() is waiting on its fence
  };

  CopyOnWrite(HandlePool& pool, Governor& governor, TierId tier, std::chrono::milliseconds wait,
              std::unique_ptr<Reservation> scratch)
      : pool_(pool), governor_(governor), tier_(tier), wait_(wait), scratch_(std::move(scratch)) {}
  Status copy(Reservation& target, std::size_t offset, std::uint32_t lane, Stream stream);
  // The copy through `lane` completed: its scratch window and fresh handle go.
  Status release_lane(std::uint32_t lane, const Pending& pending);

  HandlePool& pool_;
  Governor& governor_;
  const TierId tier_;
  const std::chrono::milliseconds wait_;
  std::unique_ptr<Reservation> scratch_;
  // A leaf: no driver, pool or reservation call is made while it is held.
  mutable Mutex mutex_;
  std::map<std::uint32_t, Pending> pending_ KVVM_GUARDED_BY(mutex_);  // by lane
};

}  // namespace kvvm
