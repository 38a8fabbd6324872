// DummyTail: one zero-filled granule, committed and billed once, then made read-only, that an
// arena maps over windows a kernel reading a padded shape may touch but no sequence has
// written, so such a read returns zeros instead of faulting. The page lives in a reservation
// of its own (its home), which must outlive every mapping of it elsewhere.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/reservation.h"

namespace kvvm {

class DummyTail {
 public:
  // Commits one granule under a grant of `tier` (waiting up to `wait` for budget), zeroes it
  // and makes it read-only. Nothing stays allocated on failure.
  static Result<std::unique_ptr<DummyTail>> create(HandlePool& pool, Governor& governor,
                                                   TierId tier, std::chrono::milliseconds wait);

  Handle handle() const { return page_.handle; }
  std::uint64_t bytes() const { return page_.bytes; }  // what it costs: one granule
  const Reservation& home() const { return *home_; }

  // Maps the page read-only at every granule of `ranges` in `target`, all or nothing: on a
  // failure the mappings this call made are withdrawn (one whose unmap fails stays poisoned
  // in `target`, which then says so) and the error is returned.
  Status map(Reservation& target, const std::vector<Range>& ranges) const;

 private:
  DummyTail(std::unique_ptr<Reservation> home, HandleInfo page)
      : home_(std::move(home)), page_(page) {}

  std::unique_ptr<Reservation> home_;
  HandleInfo page_;
};

}  // namespace kvvm
