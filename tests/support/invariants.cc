#include "support/invariants.h"

#include <fstream>
#include <map>
#include <sstream>

#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::testing {

std::vector<MapsLine> read_maps(Address begin, Address end) {
  std::vector<MapsLine> lines;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, inode, path;
    fields >> range >> perms >> offset >> device >> inode;
    std::getline(fields, path);
    path.erase(0, path.find_first_not_of(' '));
    const auto dash = range.find('-');
    const Address from = std::stoull(range.substr(0, dash), nullptr, 16);
    const Address to = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (to <= begin || from >= end) continue;
    lines.push_back(MapsLine{from, to, perms, path});
  }
  return lines;
}

namespace {

std::string expected_perms(Access access) {
  switch (access) {
    case Access::kReadWrite:
      return "rw-s";
    case Access::kReadOnly:
      return "r--s";
    case Access::kNone:
      return "---s";
  }
  return "?";
}

void check_host_maps(const Reservation& reservation, std::ostringstream& errors) {
  const Address base = reservation.base();
  const auto lines = read_maps(base, base + reservation.size());
  auto line_at = [&](Address address) -> const MapsLine* {
    for (const MapsLine& line : lines) {
      if (line.begin <= address && address < line.end) return &line;
    }
    return nullptr;
  };
  for (std::size_t offset = 0; offset < reservation.size(); offset += reservation.granule()) {
    const MapsLine* line = line_at(base + offset);
    const Block* block = reservation.block_at(offset);
    if (line == nullptr) {
      errors << "window " << offset << " of reservation " << std::hex << base << std::dec
             << " is not even reserved in /proc/self/maps\n";
      continue;
    }
    const bool memfd = line->path.find("memfd:kvvm-handle") != std::string::npos;
    if (block == nullptr) {
      if (memfd || line->perms != "---p") {
        errors << "window " << offset << " has no block but maps shows " << line->perms << " "
               << line->path << "\n";
      }
    } else if (!memfd) {
      errors << "window " << offset << " has a block but maps shows no memfd (" << line->perms
             << ")\n";
    } else if (!block->poisoned && line->perms != expected_perms(block->access)) {
      errors << "window " << offset << " recorded " << to_string(block->access)
             << " but maps shows " << line->perms << "\n";
    }
  }
}

}  // namespace

std::string check_invariants(const World& world) {
  std::ostringstream errors;
  const PoolSnapshot pool = world.pool->snapshot();

  // 1. Ledger truth.
  if (world.governor != nullptr) {
    const TierStats tier = world.governor->stats(world.tier);
    if (tier.used != pool.owned_bytes) {
      errors << "ledger: tier used " << tier.used << " != pool owned " << pool.owned_bytes << "\n";
    }
    if (tier.reserved != 0) errors << "ledger: " << tier.reserved << " bytes still reserved\n";
    if (tier.used + tier.reserved > tier.limit) errors << "ledger: over the limit\n";
  }

  // 2. One state per handle; mapping counts equal the blocks that map each handle.
  std::map<Handle, std::uint32_t> references;
  std::size_t blocks = 0;
  for (const Reservation* reservation : world.reservations) {
    for (const Block& block : reservation->blocks()) {
      ++references[block.handle];
      ++blocks;
    }
  }
  std::size_t referenced_mappings = 0;
  for (const HandleInfo& handle : world.pool->handles()) {
    const std::uint32_t expected = references.count(handle.handle) ? references[handle.handle] : 0;
    referenced_mappings += expected;
    switch (handle.state) {
      case HandleState::kPooled:
        if (handle.mappings != 0 || expected != 0) {
          errors << "handle " << handle.handle << " pooled but mapped " << expected << " times\n";
        }
        break;
      case HandleState::kInUse:
        if (handle.mappings < expected) {
          errors << "handle " << handle.handle << " counts " << handle.mappings
                 << " mappings, blocks hold " << expected << "\n";
        }
        if (handle.mappings == 0 && handle.holds == 0) {
          errors << "handle " << handle.handle << " in use, unmapped and not held\n";
        }
        break;
      case HandleState::kQuarantined:
        break;
      case HandleState::kReleased:
        errors << "handle " << handle.handle << " released but still in the table\n";
        break;
    }
    references.erase(handle.handle);
  }
  for (const auto& [handle, count] : references) {
    errors << "handle " << handle << " mapped by " << count
           << " block(s) but unknown to the pool\n";
  }
  std::size_t counted_mappings = 0;
  for (const HandleInfo& handle : world.pool->handles()) counted_mappings += handle.mappings;
  if (counted_mappings != referenced_mappings + world.leaked_mappings) {
    errors << "pool counts " << counted_mappings << " mappings; blocks hold " << referenced_mappings
           << " and " << world.leaked_mappings << " were leaked\n";
  }

  // 3 and 4. The driver holds exactly what the bookkeeping says.
  Driver* real = world.real_driver != nullptr ? world.real_driver : world.driver;
  const DriverCallCounts calls = real->counts();
  const auto succeeded = [&](DriverOp op) { return calls.of(op) - calls.failed(op); };
  // An imported handle is one the driver holds, as a created one is.
  const std::uint64_t live_handles =
      succeeded(DriverOp::kCreate) + succeeded(DriverOp::kImport) - succeeded(DriverOp::kRelease);
  const std::size_t pool_handles =
      pool.handles_in_use + pool.handles_pooled + pool.handles_quarantined;
  if (live_handles != pool_handles) {
    errors << "driver holds " << live_handles << " handles, pool knows " << pool_handles << "\n";
  }
  const std::uint64_t live_reservations =
      succeeded(DriverOp::kReserve) - succeeded(DriverOp::kFree);
  if (live_reservations != world.reservations.size() + world.leaked_reservations) {
    errors << "driver holds " << live_reservations << " reservations, tests hold "
           << world.reservations.size() << " (+" << world.leaked_reservations << " leaked)\n";
  }
  if (real->info().backend == "host") {
    const HostDriverTables tables = host_driver_tables(*real);
    if (tables.handles != pool_handles || tables.handle_bytes != pool.owned_bytes) {
      errors << "host driver holds " << tables.handles << " handles / " << tables.handle_bytes
             << " bytes, pool owns " << pool_handles << " / " << pool.owned_bytes << "\n";
    }
    if (tables.mappings != blocks + world.leaked_mappings) {
      errors << "host driver holds " << tables.mappings << " mappings, blocks " << blocks << " (+"
             << world.leaked_mappings << " leaked)\n";
    }
    for (const Reservation* reservation : world.reservations) check_host_maps(*reservation, errors);
  }

  // 6. Nothing a copy in flight reads or writes was unmapped (the fault driver models a GPU's
  // copies, whichever driver it wraps).
  if (const auto* fault = dynamic_cast<const FaultDriver*>(world.driver)) {
    for (const std::string& violation : fault->in_flight_violations()) {
      errors << "invariant 6: " << violation << "\n";
    }
  }
  return errors.str();
}

}  // namespace kvvm::testing
