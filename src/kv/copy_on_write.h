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
// Thread-safety: calls with different lanes (scratch windows) may run concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "kvvm/governor.h"
#include "kvvm/handle_pool.h"
#include "kvvm/reservation.h"
#include "kvvm/status.h"

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
  // its handle has no other mapping or hold, else copied into a fresh handle through scratch
  // window `lane`. On failure the window keeps its old mapping (unless `target` reports
  // otherwise: see Reservation::replace) and no fresh handle stays charged.
  Result<Outcome> make_writable(Reservation& target, std::size_t offset, std::uint32_t lane,
                                Stream stream);

  const Reservation& scratch() const { return *scratch_; }

 private:
  CopyOnWrite(HandlePool& pool, Governor& governor, TierId tier, std::chrono::milliseconds wait,
              std::unique_ptr<Reservation> scratch)
      : pool_(pool), governor_(governor), tier_(tier), wait_(wait), scratch_(std::move(scratch)) {}
  Status copy(Reservation& target, std::size_t offset, std::uint32_t lane, Stream stream);

  HandlePool& pool_;
  Governor& governor_;
  const TierId tier_;
  const std::chrono::milliseconds wait_;
  std::unique_ptr<Reservation> scratch_;
};

}  // namespace kvvm
