// The tests' seam to Governor's test-only calls, which are kept out of its public API.
#pragma once

#include <cstdint>

#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"

namespace kvvm::testing {

struct GovernorTestAccess {
  static Status charge_direct(Governor& governor, TierId tier, std::uint64_t bytes) {
    return governor.charge_direct(tier, bytes);
  }
};

// Charges `bytes` to `tier` without a grant, as if a holder had adopted them: a tier filled
// in one call. ResourceExhausted (and nothing changes) when they do not fit.
inline Status charge_direct(Governor& governor, TierId tier, std::uint64_t bytes) {
  return GovernorTestAccess::charge_direct(governor, tier, bytes);
}

}  // namespace kvvm::testing
