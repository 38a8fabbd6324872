// Process-wide teardown leak counters (see TeardownStats in reservation.h).
#pragma once

#include <cstdint>

namespace kvvm::detail {

void note_leaked_reservation();
void note_leaked_blocks(std::uint64_t blocks, std::uint64_t bytes);
void note_leaked_addresses(std::uint64_t bytes);
void note_free_failure();

}  // namespace kvvm::detail
