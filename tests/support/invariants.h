// The invariants of docs/ARCHITECTURE.md "Invariants", checked from outside after every public
// call in the tests.
#pragma once

#include <string>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/reservation.h"

namespace kvvm::testing {

struct World {
  // The driver the pool talks to (possibly a FaultDriver) and the real one beneath it.
  Driver* driver = nullptr;
  Driver* real_driver = nullptr;
  HandlePool* pool = nullptr;
  Governor* governor = nullptr;  // optional
  TierId tier = 0;
  // Every live reservation on this pool; the pool must be the only creator of handles and
  // these the only reservations on real_driver (so driver-side counts can be compared).
  std::vector<const Reservation*> reservations;
  // Handles deliberately leaked by a failed teardown: still in use, but no live reservation
  // holds their mappings any more.
  std::size_t leaked_mappings = 0;
  std::size_t leaked_reservations = 0;
};

// Returns a description of every violated invariant; empty when all hold:
//  1. ledger truth: the tier's used bytes equal the pool's owned bytes; nothing reserved;
//  2. one state per handle; a handle's mapping count equals the blocks mapping it; a pooled
//     handle is mapped nowhere;
//  3. bookkeeping equals the real mappings: on the host, /proc/self/maps shows a memfd
//     mapping with the recorded access under every recorded block and nothing elsewhere;
//     on any driver, the driver's live handles equal the pool's;
//  4. nothing leaked but what is counted: quarantined or deliberately leaked;
//  6. when the driver is a FaultDriver: no unmap or free met a copy still in flight.
std::string check_invariants(const World& world);

// The lines of /proc/self/maps inside [begin, end).
struct MapsLine {
  Address begin = 0;
  Address end = 0;
  std::string perms;  // "rw-s", "r--s", "---p", ...
  std::string path;
};
std::vector<MapsLine> read_maps(Address begin, Address end);

}  // namespace kvvm::testing
