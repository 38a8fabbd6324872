#include "vmm/teardown_stats.h"

#include <atomic>

#include "kvvm/vmm/reservation.h"

namespace kvvm {
namespace {

std::atomic<std::uint64_t> leaked_reservations{0};
std::atomic<std::uint64_t> leaked_blocks{0};
std::atomic<std::uint64_t> leaked_bytes{0};
std::atomic<std::uint64_t> leaked_address_bytes{0};
std::atomic<std::uint64_t> free_failures{0};

}  // namespace

TeardownStats teardown_stats() {
  return TeardownStats{leaked_reservations.load(), leaked_blocks.load(), leaked_bytes.load(),
                       leaked_address_bytes.load(), free_failures.load()};
}

void reset_teardown_stats() {
  leaked_reservations = 0;
  leaked_blocks = 0;
  leaked_bytes = 0;
  leaked_address_bytes = 0;
  free_failures = 0;
}

namespace detail {

void note_leaked_reservation() { leaked_reservations.fetch_add(1); }
void note_leaked_blocks(std::uint64_t blocks, std::uint64_t bytes) {
  leaked_blocks.fetch_add(blocks);
  leaked_bytes.fetch_add(bytes);
}
void note_leaked_addresses(std::uint64_t bytes) { leaked_address_bytes.fetch_add(bytes); }
void note_free_failure() { free_failures.fetch_add(1); }

}  // namespace detail
}  // namespace kvvm
