// The non-template parts of the Reservation fault-sweep runner.
#include "support/reservation_fault_sweep.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvvm::testing::reservation_sweep {

void add_reservation(Rig& rig, std::size_t granules) {
  auto created = Reservation::create(*rig.pool, granules * rig.g);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  rig.reservations.push_back(std::move(created).value());
}

Status commit_granules(Rig& rig, std::size_t r, std::size_t first, std::size_t count,
                       std::size_t handle_granules) {
  const std::uint64_t bytes = count * rig.g;
  Result<Grant> grant = rig.governor.prepare(rig.tier, bytes);
  if (!grant.ok()) return grant.status();
  return rig.at(r).commit(first * rig.g, bytes, &grant.value(),
                          CommitOptions{Access::kReadWrite, handle_granules * rig.g});
}

std::vector<unsigned char> pattern(std::uint64_t seed) {
  std::vector<unsigned char> bytes(kPatternBytes);
  for (std::size_t i = 0; i < kPatternBytes; ++i) {
    bytes[i] = static_cast<unsigned char>(mix(seed + i / 8) >> (8 * (i % 8)));
  }
  return bytes;
}

void fill(Rig& rig, std::size_t r, std::size_t first, std::size_t count) {
  for (std::size_t w = first; w < first + count; ++w) {
    const std::uint64_t seed = mix((r << 40) ^ (w << 20) ^ ++rig.fills);
    const std::vector<unsigned char> bytes = pattern(seed);
    const Address window = rig.at(r).base() + w * rig.g;
    if (rig.real->info().backend == "host") {
      // A write into memory that is not read-write faults on the host: check first, so that
      // a bookkeeping bug fails the test instead of crashing it.
      for (const kt::MapsLine& line : kt::read_maps(window, window + rig.g)) {
        ASSERT_EQ(line.perms, "rw-s") << "reservation " << r << " window " << w * rig.g
                                      << " is not mapped read-write: " << line.path;
      }
    }
    const Status head = rig.real->write(window, bytes.data(), bytes.size());
    const Status tail = rig.real->write(window + rig.g - kPatternBytes, bytes.data(), bytes.size());
    ASSERT_TRUE(head.ok() && tail.ok()) << head.to_string() << " " << tail.to_string();
    rig.seeds[{r, w * rig.g}] = seed;
  }
}

void share_seeds(Rig& rig, std::size_t from, std::size_t from_first, std::size_t to,
                 std::size_t to_first, std::size_t count) {
  for (std::size_t w = 0; w < count; ++w) {
    rig.seeds[{to, (to_first + w) * rig.g}] = rig.seeds.at({from, (from_first + w) * rig.g});
  }
}

std::string verify_content(Rig& rig) {
  std::ostringstream problems;
  for (std::size_t r = 0; r < rig.reservations.size(); ++r) {
    if (!rig.reservations[r]) continue;
    const Reservation& reservation = *rig.reservations[r];
    for (const Block& block : reservation.blocks()) {
      if (block.poisoned || block.access == Access::kNone) continue;
      for (std::size_t offset = block.offset; offset < block.offset + block.bytes;
           offset += rig.g) {
        auto seed = rig.seeds.find({r, offset});
        if (seed == rig.seeds.end()) {
          problems << "reservation " << r << " window " << offset
                   << " is mapped but no content was ever written there\n";
          continue;
        }
        const std::vector<unsigned char> expected = pattern(seed->second);
        std::vector<unsigned char> head(kPatternBytes), tail(kPatternBytes);
        const Address window = reservation.base() + offset;
        const Status read_head = rig.real->read(head.data(), window, kPatternBytes);
        const Status read_tail =
            rig.real->read(tail.data(), window + rig.g - kPatternBytes, kPatternBytes);
        if (!read_head.ok() || !read_tail.ok()) {
          problems << "reservation " << r << " window " << offset
                   << " cannot be read: " << read_head.to_string() << " " << read_tail.to_string()
                   << "\n";
        } else if (head != expected || tail != expected) {
          problems << "reservation " << r << " window " << offset << " lost its content\n";
        }
      }
    }
  }
  return problems.str();
}

std::string show(const Block& b) {
  std::ostringstream text;
  text << "[" << b.offset << ", " << b.offset + b.bytes << ") handle " << b.handle << "+"
       << b.handle_offset << " " << to_string(b.access) << (b.shared ? " shared" : "")
       << (b.poisoned ? " POISONED" : "");
  return text.str();
}

std::string show(const std::vector<Block>& blocks) {
  std::string text = "{";
  for (const Block& block : blocks) text += (text.size() > 1 ? "; " : "") + show(block);
  return text + "}";
}

std::vector<Block> inside(const std::vector<Block>& blocks, std::size_t offset, std::size_t len) {
  std::vector<Block> kept;
  for (const Block& b : blocks) {
    if (b.offset >= offset && b.offset < offset + len) kept.push_back(b);
  }
  return kept;
}

std::vector<Block> outside(const std::vector<Block>& blocks, std::size_t offset, std::size_t len) {
  std::vector<Block> kept;
  for (const Block& b : blocks) {
    if (b.offset < offset || b.offset >= offset + len) kept.push_back(b);
  }
  return kept;
}

std::uint64_t bytes_of(const std::vector<Block>& blocks) {
  std::uint64_t bytes = 0;
  for (const Block& b : blocks) bytes += b.bytes;
  return bytes;
}

State capture(const Rig& rig) {
  State state;
  for (const auto& reservation : rig.reservations) {
    state.blocks.push_back(reservation ? reservation->blocks() : std::vector<Block>{});
    state.residual.push_back(reservation ? reservation->residual_bytes() : 0);
  }
  state.pool = rig.pool->snapshot();
  state.tier = rig.governor.stats(rig.tier);
  state.tables = host_driver_tables(*rig.real);
  state.teardown = teardown_stats();
  return state;
}

DriverCallCounts minus(const DriverCallCounts& after, const DriverCallCounts& before) {
  DriverCallCounts delta;
  for (std::size_t i = 0; i < kDriverOpCount; ++i) {
    delta.calls[i] = after.calls[i] - before.calls[i];
    delta.failures[i] = after.failures[i] - before.failures[i];
  }
  return delta;
}

bool mentions(const Status& status, std::string_view word) {
  return status.message().find(word) != std::string::npos;
}

std::string range_text(std::size_t offset, std::size_t len) {
  return "[" + std::to_string(offset) + ", " + std::to_string(offset + len) + ")";
}

void arm_with_failing_undo(FaultDriver& fault, std::uint64_t position) {
  fault.fail_nth_call(position);
  fault.fail_nth(DriverOp::kUnmap, 1);
}

}  // namespace kvvm::testing::reservation_sweep
