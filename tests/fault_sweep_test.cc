// Fault sweeps (DESIGN.md "Tests"): every driver call of every multi-step Reservation
// operation is made to fail in turn, and after each failure the invariants are checked
// together with the operation's own contract (invariant 3): it completed, or it restored the
// exact prior state, or it reported precisely what stayed changed ("poisoned" residual,
// quarantined handles) -- nothing else.
//
// How a sweep works: the operation runs once without faults to count the N driver calls it
// makes; then, for each position i in 1..N, a FRESH world (its own driver, fault driver,
// governor and pool, so that the driver's cumulative call counts and tables describe this
// world only) is prepared identically, FaultDriver::fail_nth_call(i) is armed right before the
// operation, the operation runs, the plan is cleared and the outcome is checked. A single fault
// can never reach the "residual" branch (the undo path has to fail as well), so double-fault
// variants also fail the first unmap of the undo path.
//
// Content: every committed window gets a pattern at its first and last bytes right after its
// commit; after every operation the pattern is read back through every healthy, accessible
// block of every live reservation (a shared block reads its owner's pattern).
#include <gtest/gtest.h>

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

#include "kvvm/driver.h"
#include "kvvm/fault_driver.h"
#include "kvvm/governor.h"
#include "kvvm/handle_pool.h"
#include "kvvm/host_driver.h"
#include "kvvm/reservation.h"
#include "support/backends.h"
#include "support/invariants.h"

namespace kvvm {
namespace {

namespace kt = ::kvvm::testing;

constexpr std::uint64_t kTierGranules = 256;
constexpr std::size_t kPatternBytes = 64;
constexpr std::size_t kNoPoolBound = 256ull << 20;  // the pool keeps every returned handle

// ---------------------------------------------------------------------------------------------
// The world of one trial.

struct Rig {
  // Declaration order is destruction order reversed: reservations go first, then the pool
  // (which deregisters its reclaimer), the governor, the fault driver, the real driver.
  std::unique_ptr<Driver> real;
  std::unique_ptr<FaultDriver> fault;
  Governor governor;
  TierId tier = 0;
  std::unique_ptr<HandlePool> pool;
  std::vector<std::unique_ptr<Reservation>> reservations;  // null once torn down
  // Expected pattern seed of each window: (reservation index, window offset) -> seed.
  std::map<std::pair<std::size_t, std::size_t>, std::uint64_t> seeds;
  std::uint64_t fills = 0;
  std::size_t leaked_mappings = 0;
  std::size_t leaked_reservations = 0;
  std::size_t g = 0;  // the granule

  Reservation& at(std::size_t r) { return *reservations.at(r); }

  kt::World world() {
    kt::World world;
    world.driver = fault.get();
    world.real_driver = real.get();
    world.pool = pool.get();
    world.governor = &governor;
    world.tier = tier;
    for (const auto& reservation : reservations) {
      if (reservation) world.reservations.push_back(reservation.get());
    }
    world.leaked_mappings = leaked_mappings;
    world.leaked_reservations = leaked_reservations;
    return world;
  }
};

template <typename B>
std::unique_ptr<Rig> make_rig(std::uint64_t max_pooled_bytes) {
  auto rig = std::make_unique<Rig>();
  rig->real = kt::make_driver_or_null<B>();
  if (!rig->real) return nullptr;
  rig->fault = std::make_unique<FaultDriver>(*rig->real);
  rig->g = rig->real->granule();
  rig->tier = rig->governor.add_tier("sweep", kTierGranules * rig->g);
  rig->pool = std::make_unique<HandlePool>(
      *rig->fault, PoolOptions{.max_pooled_bytes = max_pooled_bytes}, &rig->governor, rig->tier);
  return rig;
}

void add_reservation(Rig& rig, std::size_t granules) {
  auto created = Reservation::create(*rig.pool, granules * rig.g);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  rig.reservations.push_back(std::move(created).value());
}

// Prepares a grant for the whole range and commits [first, first + count) granules of
// reservation `r` read-write in handles of `handle_granules` granules.
Status commit_granules(Rig& rig, std::size_t r, std::size_t first, std::size_t count,
                       std::size_t handle_granules = 1) {
  const std::uint64_t bytes = count * rig.g;
  Result<Grant> grant = rig.governor.prepare(rig.tier, bytes);
  if (!grant.ok()) return grant.status();
  return rig.at(r).commit(first * rig.g, bytes, &grant.value(),
                          CommitOptions{Access::kReadWrite, handle_granules * rig.g});
}

// ---------------------------------------------------------------------------------------------
// Content patterns.

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<unsigned char> pattern(std::uint64_t seed) {
  std::vector<unsigned char> bytes(kPatternBytes);
  for (std::size_t i = 0; i < kPatternBytes; ++i) {
    bytes[i] = static_cast<unsigned char>(mix(seed + i / 8) >> (8 * (i % 8)));
  }
  return bytes;
}

// Writes a fresh pattern at the first and last bytes of each window of
// [first, first + count) granules of reservation `r` (which must be mapped read-write).
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

// The windows [to_first, to_first + count) of reservation `to` show the same bytes as the
// windows from `from_first` of reservation `from` (a shared mapping).
void share_seeds(Rig& rig, std::size_t from, std::size_t from_first, std::size_t to,
                 std::size_t to_first, std::size_t count) {
  for (std::size_t w = 0; w < count; ++w) {
    rig.seeds[{to, (to_first + w) * rig.g}] = rig.seeds.at({from, (from_first + w) * rig.g});
  }
}

// Reads every window of every healthy, accessible block of every live reservation back and
// compares it with the pattern written there; returns the differences.
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

// ---------------------------------------------------------------------------------------------
// State before and after an operation.

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

// The blocks lying inside / outside [offset, offset + len).
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

struct State {
  std::vector<std::vector<Block>> blocks;  // by reservation index; empty once torn down
  std::vector<std::uint64_t> residual;
  PoolSnapshot pool;
  TierStats tier;
  HostDriverTables tables;  // host backends only
  TeardownStats teardown;
};

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

// ---------------------------------------------------------------------------------------------
// The sweep runner.

struct Trial {
  std::uint64_t position = 0;   // 0: the clean run
  std::uint64_t positions = 0;  // N, known after the clean run
  Status status;                // what the operation returned
  State before;                 // captured right before the operation
  DriverCallCounts calls;       // fault-driver calls the operation made (with failures)
  std::uint64_t injected = 0;

  std::string where() const {
    return position == 0 ? std::string("clean run")
                         : "fault at position " + std::to_string(position) + " of " +
                               std::to_string(positions);
  }
};

// What an operation did, as its check classified it.
enum class Outcome {
  kCompleted,  // returned OK with the complete result
  kRestored,   // failed and restored the exact prior state
  kResidual,   // failed and reported what stayed changed (poisoned, quarantined)
  kLeaked,     // teardown whose synchronization failed: deliberately leaked, counted
};

struct SweepResult {
  std::uint64_t positions = 0;
  std::map<Outcome, std::uint64_t> outcomes;  // over the faulted positions only
  std::uint64_t count(Outcome outcome) const {
    auto it = outcomes.find(outcome);
    return it == outcomes.end() ? 0 : it->second;
  }
};

struct Sweep {
  std::string name;
  std::uint64_t max_pooled_bytes = kNoPoolBound;
  std::function<void(Rig&)> setup;
  std::function<Status(Rig&)> op;
  // Checks the outcome (the fault plan is already cleared) and classifies it. May do more
  // to the world afterwards (retries).
  std::function<Outcome(Rig&, const Trial&)> check;
  // Arms the faults of position i (1-based); default: fail_nth_call(i).
  std::function<void(FaultDriver&, std::uint64_t)> arm;
  // The number of positions, from the clean run; default: the driver calls it made.
  std::function<std::uint64_t(const Trial&)> count_positions;
  // Faults each armed position must inject: exactly this many, or (0) at least one.
  std::uint64_t injections = 1;
};

template <typename B>
SweepResult run_sweep(const Sweep& sweep) {
  SweepResult result;
  std::uint64_t& positions = result.positions;
  for (std::uint64_t position = 0; position == 0 || position <= positions; ++position) {
    const std::string label =
        sweep.name + (position == 0 ? std::string(", clean run")
                                    : ", fault at position " + std::to_string(position));
    SCOPED_TRACE(label);
    std::unique_ptr<Rig> rig = make_rig<B>(sweep.max_pooled_bytes);
    if (!rig) {
      ADD_FAILURE() << label << ": the driver could not be made";
      return result;
    }
    sweep.setup(*rig);
    if (::testing::Test::HasFatalFailure()) return result;

    Trial trial;
    trial.position = position;
    trial.positions = positions;
    trial.before = capture(*rig);
    const DriverCallCounts calls_before = rig->fault->counts();
    const std::uint64_t injected_before = rig->fault->injected();
    if (position > 0) {
      if (sweep.arm) {
        sweep.arm(*rig->fault, position);
      } else {
        rig->fault->fail_nth_call(position);
      }
    }
    trial.status = sweep.op(*rig);
    rig->fault->clear();
    trial.calls = minus(rig->fault->counts(), calls_before);
    trial.injected = rig->fault->injected() - injected_before;

    if (position == 0) {
      EXPECT_TRUE(trial.status.ok()) << label << ": " << trial.status.to_string();
      EXPECT_EQ(trial.injected, 0u) << label;
      positions = sweep.count_positions ? sweep.count_positions(trial) : trial.calls.total();
      trial.positions = positions;
      if (positions == 0) break;
    } else if (sweep.injections > 0) {
      EXPECT_EQ(trial.injected, sweep.injections)
          << label << ": the armed fault(s) were not all injected";
    } else {
      EXPECT_GE(trial.injected, 1u) << label << ": the armed fault was never injected";
    }
    const Outcome outcome = sweep.check(*rig, trial);
    if (::testing::Test::HasFatalFailure()) return result;
    if (position == 0) {
      EXPECT_EQ(outcome, Outcome::kCompleted) << label;
    } else {
      ++result.outcomes[outcome];
    }
  }
  std::cout << "[ sweep ] " << sweep.name << ": forced " << positions << " positions ("
            << result.count(Outcome::kCompleted) << " completed, "
            << result.count(Outcome::kRestored) << " restored, " << result.count(Outcome::kResidual)
            << " residual, " << result.count(Outcome::kLeaked) << " leaked)\n";
  EXPECT_GT(positions, 0u) << sweep.name << ": the operation made no driver call";
  return result;
}

// Arms position i and also fails the first unmap after it (the undo path's).
void arm_with_failing_undo(FaultDriver& fault, std::uint64_t position) {
  fault.fail_nth_call(position);
  fault.fail_nth(DriverOp::kUnmap, 1);
}

// ---------------------------------------------------------------------------------------------
// Commit: reservation 0 (16 granules) holds content in neighbours right before the first and
// right after the last committed range; the operation commits the ranges (by default the one
// range [2, 2 + k) granules, with neighbours [0, 2) and [2 + k, 3 + k)), with commit() for one
// range and commit_ranges() for several.

struct CommitCase {
  std::string name;
  std::size_t k = 1;
  std::size_t handle_granules = 1;
  bool warm = false;  // the pool already holds the handles the commit needs
  std::uint64_t max_pooled_bytes = kNoPoolBound;
  bool failing_undo = false;  // double fault: the rollback's first unmap fails too
  // Several ranges, {first granule, granules} each, committed as one transaction; when
  // empty, the one range {2, k}.
  std::vector<std::pair<std::size_t, std::size_t>> ranges = {};
};

std::vector<std::pair<std::size_t, std::size_t>> granule_ranges(const CommitCase& c) {
  if (c.ranges.empty()) return {{2, c.k}};
  return c.ranges;
}

std::size_t total_granules(const CommitCase& c) {
  std::size_t total = 0;
  for (const auto& [first, count] : granule_ranges(c)) total += count;
  return total;
}

// The blocks in [offset, offset + len) are exactly a fresh commit in handles of
// `handle_bytes`: read-write, private, healthy, each handle in use with one mapping.
void expect_committed(const Rig& rig, const std::vector<Block>& blocks, std::size_t offset,
                      std::size_t len, std::size_t handle_bytes, const std::string& where) {
  std::vector<std::size_t> sizes;
  for (std::size_t at = offset; at < offset + len; at += handle_bytes) {
    sizes.push_back(std::min(handle_bytes, offset + len - at));
  }
  ASSERT_EQ(blocks.size(), sizes.size()) << where << ": committed blocks " << show(blocks);
  std::size_t at = offset;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    EXPECT_TRUE(b.offset == at && b.bytes == sizes[i] && b.handle_offset == 0 &&
                b.access == Access::kReadWrite && !b.shared && !b.poisoned)
        << where << ": block " << show(b) << " is not the committed window at " << at;
    Result<HandleInfo> info = rig.pool->describe(b.handle);
    ASSERT_TRUE(info.ok()) << where << ": " << info.status().to_string();
    EXPECT_EQ(info->state, HandleState::kInUse) << where << ": " << show(b);
    EXPECT_EQ(info->mappings, 1u) << where << ": " << show(b);
    EXPECT_EQ(info->bytes, b.bytes) << where << ": " << show(b);
    at += b.bytes;
  }
}

// Every range of the case committed, each handle distinct.
void expect_all_committed(Rig& rig, const CommitCase& c, const std::string& where) {
  const std::vector<Block> blocks = rig.at(0).blocks();
  std::vector<Handle> handles;
  for (const auto& [first, count] : granule_ranges(c)) {
    const std::vector<Block> in_range = inside(blocks, first * rig.g, count * rig.g);
    expect_committed(rig, in_range, first * rig.g, count * rig.g, c.handle_granules * rig.g, where);
    if (::testing::Test::HasFatalFailure()) return;
    for (const Block& b : in_range) handles.push_back(b.handle);
  }
  std::sort(handles.begin(), handles.end());
  EXPECT_EQ(std::adjacent_find(handles.begin(), handles.end()), handles.end())
      << where << ": one handle mapped twice by one commit: " << show(blocks);
}

// The blocks inside / outside every range of the case.
std::vector<Block> inside_ranges(const Rig& rig, const std::vector<Block>& blocks,
                                 const CommitCase& c) {
  std::vector<Block> kept;
  for (const auto& [first, count] : granule_ranges(c)) {
    for (const Block& b : inside(blocks, first * rig.g, count * rig.g)) kept.push_back(b);
  }
  return kept;
}
std::vector<Block> outside_ranges(const Rig& rig, std::vector<Block> blocks, const CommitCase& c) {
  for (const auto& [first, count] : granule_ranges(c)) {
    blocks = outside(blocks, first * rig.g, count * rig.g);
  }
  return blocks;
}

Status commit_case(Rig& rig, const CommitCase& c) {
  const auto ranges = granule_ranges(c);
  if (ranges.size() == 1) {
    return commit_granules(rig, 0, ranges[0].first, ranges[0].second, c.handle_granules);
  }
  Result<Grant> grant = rig.governor.prepare(rig.tier, total_granules(c) * rig.g);
  if (!grant.ok()) return grant.status();
  std::vector<Range> byte_ranges;
  for (const auto& [first, count] : ranges) byte_ranges.push_back({first * rig.g, count * rig.g});
  return rig.at(0).commit_ranges(byte_ranges, &grant.value(),
                                 CommitOptions{Access::kReadWrite, c.handle_granules * rig.g});
}

void fill_case(Rig& rig, const CommitCase& c) {
  for (const auto& [first, count] : granule_ranges(c)) fill(rig, 0, first, count);
}

void check_commit(Rig& rig, const Trial& t, const CommitCase& c, Outcome* outcome) {
  const std::string where = c.name + ", " + t.where();
  Reservation& reservation = rig.at(0);
  const State after = capture(rig);

  ASSERT_EQ(kt::check_invariants(rig.world()), "") << where;
  EXPECT_EQ(show(outside_ranges(rig, after.blocks[0], c)),
            show(outside_ranges(rig, t.before.blocks[0], c)))
      << where << ": blocks outside the committed ranges changed";
  const std::vector<Block> in_ranges = inside_ranges(rig, after.blocks[0], c);

  bool residual = false;
  *outcome = t.status.ok() ? Outcome::kCompleted : Outcome::kRestored;
  if (t.status.ok()) {
    expect_all_committed(rig, c, where);
    if (::testing::Test::HasFatalFailure()) return;
    fill_case(rig, c);
  } else {
    EXPECT_EQ(t.status.code(), StatusCode::kDriverError) << where << ": " << t.status.to_string();
    EXPECT_EQ(after.pool.handles_in_use, t.before.pool.handles_in_use)
        << where << ": a failed commit kept handles checked out";
    if (reservation.residual_bytes() == t.before.residual[0]) {
      // The exact prior state: no block, and the grant rolled back (DESIGN.md: "grant: ...
      // committed with the real byte count, or rolled back"), so the handles the commit
      // created are gone again and the ledger is where it was.
      EXPECT_TRUE(in_ranges.empty()) << where << ": a rolled-back commit left " << show(in_ranges);
      EXPECT_FALSE(mentions(t.status, "poisoned")) << where << ": " << t.status.to_string();
      EXPECT_EQ(after.pool.mapped_bytes, t.before.pool.mapped_bytes) << where;
      EXPECT_EQ(after.pool.quarantined_bytes, t.before.pool.quarantined_bytes) << where;
      EXPECT_EQ(after.pool.pooled_bytes, t.before.pool.pooled_bytes)
          << where << ": the rolled-back commit changed the pool";
      EXPECT_EQ(after.pool.owned_bytes, t.before.pool.owned_bytes) << where;
      EXPECT_EQ(after.tier.used, t.before.tier.used)
          << where << ": the rolled-back commit left bytes charged";
    } else {
      // Residual: reported, poisoned, quarantined; and nothing healthy left in the ranges.
      residual = true;
      *outcome = Outcome::kResidual;
      EXPECT_TRUE(mentions(t.status, "poisoned"))
          << where << ": residual not reported: " << t.status.to_string();
      EXPECT_GT(after.pool.handles_quarantined, t.before.pool.handles_quarantined) << where;
      EXPECT_EQ(reservation.residual_bytes() - t.before.residual[0], bytes_of(in_ranges)) << where;
      for (const Block& b : in_ranges) {
        EXPECT_TRUE(b.poisoned) << where << ": healthy block left by a failed commit: " << show(b);
        Result<HandleInfo> info = rig.pool->describe(b.handle);
        EXPECT_TRUE(info.ok() && info->state == HandleState::kQuarantined)
            << where << ": the handle of poisoned " << show(b) << " is not quarantined";
        EXPECT_NE(t.status.message().find(range_text(b.offset, b.bytes)), std::string::npos)
            << where << ": " << show(b) << " not named in " << t.status.to_string();
      }
      // Beyond the poisoned blocks, the ledger is where it was.
      EXPECT_EQ(after.pool.owned_bytes - after.pool.quarantined_bytes,
                t.before.pool.owned_bytes - t.before.pool.quarantined_bytes)
          << where;
    }
  }
  EXPECT_EQ(verify_content(rig), "") << where;

  // Nothing was left half-done: the same commit, retried without faults, succeeds.
  if (!t.status.ok() && !residual) {
    const Status retry = commit_case(rig, c);
    ASSERT_TRUE(retry.ok()) << where
                            << ": retry after a rolled-back commit failed: " << retry.to_string();
    expect_all_committed(rig, c, where + ", retry");
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(kt::check_invariants(rig.world()), "") << where << ", retry";
    fill_case(rig, c);
    EXPECT_EQ(verify_content(rig), "") << where << ", retry";
  }
}

Sweep commit_sweep(const CommitCase& c) {
  Sweep sweep;
  sweep.name = c.name;
  sweep.max_pooled_bytes = c.max_pooled_bytes;
  sweep.setup = [c](Rig& rig) {
    add_reservation(rig, 16);
    add_reservation(rig, 8);
    if (::testing::Test::HasFatalFailure()) return;
    const auto ranges = granule_ranges(c);
    const std::size_t first = ranges.front().first;
    const std::size_t end = ranges.back().first + ranges.back().second;
    ASSERT_TRUE(commit_granules(rig, 0, 0, first).ok());
    ASSERT_TRUE(commit_granules(rig, 0, end, 1).ok());
    fill(rig, 0, 0, first);
    fill(rig, 0, end, 1);
    if (c.warm) {
      // The same handle sizes, committed elsewhere and released: now pooled.
      for (const auto& [start, count] : ranges) {
        ASSERT_TRUE(commit_granules(rig, 1, 0, count, c.handle_granules).ok());
        ASSERT_TRUE(rig.at(1).release(0, count * rig.g).ok());
      }
    }
  };
  sweep.op = [c](Rig& rig) { return commit_case(rig, c); };
  sweep.check = [c](Rig& rig, const Trial& t) {
    Outcome outcome = Outcome::kCompleted;
    check_commit(rig, t, c, &outcome);
    if (c.warm && t.position == 0) {
      EXPECT_EQ(t.calls.of(DriverOp::kCreate), 0u) << c.name << ": a warm commit created";
    }
    return outcome;
  };
  if (c.failing_undo) {
    sweep.arm = arm_with_failing_undo;
    sweep.injections = 0;  // the undo's unmap fails only where something was mapped
  }
  return sweep;
}

// ---------------------------------------------------------------------------------------------
// map_shared: reservation 0 (the owner) holds a handle of `handle_granules` at [0, hg) and a
// neighbour at [hg, hg + 1); reservation 1 holds [0, 1) and maps (part of) the owner's handle
// read-only at granule 2.

struct ShareCase {
  std::string name;
  std::size_t handle_granules = 1;
  std::size_t handle_offset_granules = 0;
  std::size_t granules = 0;  // 0: to the handle's end
  bool failing_undo = false;
};

void check_share(Rig& rig, const Trial& t, const ShareCase& c, Outcome* outcome) {
  const std::string where = c.name + ", " + t.where();
  const std::size_t g = rig.g;
  const std::size_t offset = 2 * g;
  const std::size_t granules =
      c.granules != 0 ? c.granules : c.handle_granules - c.handle_offset_granules;
  const State after = capture(rig);
  const Handle handle = t.before.blocks[0].at(0).handle;
  Result<HandleInfo> info = rig.pool->describe(handle);
  ASSERT_TRUE(info.ok()) << where << ": " << info.status().to_string();

  ASSERT_EQ(kt::check_invariants(rig.world()), "") << where;
  // The owner's mappings never change, whatever happened to the sharer.
  EXPECT_EQ(show(after.blocks[0]), show(t.before.blocks[0])) << where << ": the owner changed";
  EXPECT_EQ(show(outside(after.blocks[1], offset, granules * g)),
            show(outside(t.before.blocks[1], offset, granules * g)))
      << where;
  const std::vector<Block> mapped = inside(after.blocks[1], offset, granules * g);

  bool residual = false;
  *outcome = t.status.ok() ? Outcome::kCompleted : Outcome::kRestored;
  if (t.status.ok()) {
    ASSERT_EQ(mapped.size(), 1u) << where << ": " << show(mapped);
    const Block& b = mapped[0];
    EXPECT_TRUE(b.offset == offset && b.bytes == granules * g && b.handle == handle &&
                b.handle_offset == c.handle_offset_granules * g && b.access == Access::kReadOnly &&
                b.shared && !b.poisoned)
        << where << ": " << show(b);
    EXPECT_EQ(info->state, HandleState::kInUse) << where;
    EXPECT_EQ(info->mappings, 2u) << where;
    share_seeds(rig, 0, c.handle_offset_granules, 1, 2, granules);
  } else {
    EXPECT_EQ(t.status.code(), StatusCode::kDriverError) << where << ": " << t.status.to_string();
    if (rig.at(1).residual_bytes() == t.before.residual[1]) {
      // Withdrawn: the handle stays with its owner, mapped exactly as often as before.
      EXPECT_TRUE(mapped.empty()) << where << ": " << show(mapped);
      EXPECT_FALSE(mentions(t.status, "poisoned")) << where << ": " << t.status.to_string();
      EXPECT_EQ(info->state, HandleState::kInUse) << where;
      EXPECT_EQ(info->mappings, 1u) << where << ": the handle's mapping count changed";
      EXPECT_EQ(after.pool.owned_bytes, t.before.pool.owned_bytes) << where;
      EXPECT_EQ(after.pool.mapped_bytes, t.before.pool.mapped_bytes) << where;
      EXPECT_EQ(after.pool.quarantined_bytes, t.before.pool.quarantined_bytes) << where;
      EXPECT_EQ(after.tier.used, t.before.tier.used) << where;
    } else {
      // set_access and the withdrawing unmap both failed: the sharer's block is poisoned and
      // the shared handle quarantined (never reused, still charged); the owner is unharmed.
      residual = true;
      *outcome = Outcome::kResidual;
      EXPECT_TRUE(mentions(t.status, "poisoned")) << where << ": " << t.status.to_string();
      ASSERT_EQ(mapped.size(), 1u) << where << ": " << show(mapped);
      EXPECT_TRUE(mapped[0].poisoned && mapped[0].handle == handle) << where << show(mapped[0]);
      EXPECT_EQ(rig.at(1).residual_bytes(), granules * g) << where;
      EXPECT_EQ(info->state, HandleState::kQuarantined) << where;
      EXPECT_EQ(after.pool.handles_quarantined, t.before.pool.handles_quarantined + 1) << where;
      EXPECT_EQ(after.tier.used, t.before.tier.used) << where;
    }
  }
  EXPECT_EQ(verify_content(rig), "") << where;

  if (residual) {
    // A quarantined handle cannot be shared again: refused, changing nothing.
    const std::uint64_t calls_before = rig.fault->counts().total();
    Result<HandleInfo> quarantined = rig.pool->describe(handle);
    ASSERT_TRUE(quarantined.ok());
    const Status again = rig.at(1).map_shared(5 * g, *quarantined);
    EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << where << ": " << again.to_string();
    EXPECT_EQ(rig.fault->counts().total(), calls_before) << where;
    EXPECT_EQ(rig.at(1).block_at(5 * g), nullptr) << where;
    // The owner can still release its mapping; the handle stays quarantined and charged
    // while the poisoned mapping keeps it.
    ASSERT_TRUE(rig.at(0).release(0, c.handle_granules * g).ok()) << where;
    Result<HandleInfo> later = rig.pool->describe(handle);
    ASSERT_TRUE(later.ok()) << where << ": " << later.status().to_string();
    EXPECT_EQ(later->state, HandleState::kQuarantined) << where;
    EXPECT_EQ(later->mappings, 1u) << where;
    ASSERT_EQ(kt::check_invariants(rig.world()), "") << where << ", owner released";
    EXPECT_EQ(verify_content(rig), "") << where << ", owner released";
  } else if (!t.status.ok()) {
    // Nothing was left half-done: the same mapping, retried without faults, succeeds.
    Result<HandleInfo> again = rig.pool->describe(handle);
    ASSERT_TRUE(again.ok());
    const Status retry = rig.at(1).map_shared(offset, *again, Access::kReadOnly,
                                              c.handle_offset_granules * g, c.granules * g);
    ASSERT_TRUE(retry.ok()) << where << ": retry failed: " << retry.to_string();
    share_seeds(rig, 0, c.handle_offset_granules, 1, 2, granules);
    ASSERT_EQ(kt::check_invariants(rig.world()), "") << where << ", retry";
    EXPECT_EQ(verify_content(rig), "") << where << ", retry";
  }
}

Sweep share_sweep(const ShareCase& c) {
  Sweep sweep;
  sweep.name = c.name;
  sweep.setup = [c](Rig& rig) {
    add_reservation(rig, 8);
    add_reservation(rig, 8);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(commit_granules(rig, 0, 0, c.handle_granules, c.handle_granules).ok());
    ASSERT_TRUE(commit_granules(rig, 0, c.handle_granules, 1).ok());
    ASSERT_TRUE(commit_granules(rig, 1, 0, 1).ok());
    fill(rig, 0, 0, c.handle_granules + 1);
    fill(rig, 1, 0, 1);
  };
  sweep.op = [c](Rig& rig) {
    Result<HandleInfo> info = rig.pool->describe(rig.at(0).block_at(0)->handle);
    if (!info.ok()) return info.status();
    return rig.at(1).map_shared(2 * rig.g, *info, Access::kReadOnly,
                                c.handle_offset_granules * rig.g, c.granules * rig.g);
  };
  sweep.check = [c](Rig& rig, const Trial& t) {
    Outcome outcome = Outcome::kCompleted;
    check_share(rig, t, c, &outcome);
    if (t.position > 0 && t.calls.failed(DriverOp::kMap) == 0) {
      // The map went through and set_access failed: exactly the withdraw path.
      EXPECT_EQ(t.calls.failed(DriverOp::kSetAccess), 1u) << c.name << ", " << t.where();
    }
    return outcome;
  };
  if (c.failing_undo) {
    sweep.arm = arm_with_failing_undo;
    sweep.injections = 0;
  }
  return sweep;
}

// ---------------------------------------------------------------------------------------------
// Release: reservation 0 (16 granules) holds neighbours [0, 1) and [1 + k, 2 + k) and k
// granules at [1, 1 + k) in handles of `handle_granules`; the operation releases [1, 1 + k).

struct ReleaseCase {
  std::string name;
  std::size_t k = 1;
  std::size_t handle_granules = 1;
  std::uint64_t max_pooled_bytes = kNoPoolBound;
  // Double fault: the coalesced unmap fails and so does the per-block unmap of block i.
  bool failing_fallback = false;
};

void check_release(Rig& rig, const Trial& t, const ReleaseCase& c, Outcome* outcome) {
  const std::string where = c.name + ", " + t.where();
  const std::size_t g = rig.g;
  const std::size_t offset = g;
  const std::size_t len = c.k * g;
  Reservation& reservation = rig.at(0);
  const State after = capture(rig);
  const std::vector<Block> targets = inside(t.before.blocks[0], offset, len);
  const std::vector<Block> left = inside(after.blocks[0], offset, len);

  ASSERT_EQ(kt::check_invariants(rig.world()), "") << where;
  EXPECT_EQ(show(outside(after.blocks[0], offset, len)),
            show(outside(t.before.blocks[0], offset, len)))
      << where << ": blocks outside the released range changed";

  *outcome = t.status.ok() ? Outcome::kCompleted : Outcome::kResidual;
  if (t.status.ok()) {
    EXPECT_TRUE(left.empty()) << where << ": released range still holds " << show(left);
    EXPECT_EQ(reservation.residual_bytes(), 0u) << where;
    // Each handle went back to the pool, or was released, or (its release failed) is
    // quarantined and counted as a release failure: nothing else.
    const std::uint64_t release_failures =
        after.pool.release_failures - t.before.pool.release_failures;
    EXPECT_EQ(after.pool.handles_quarantined - t.before.pool.handles_quarantined, release_failures)
        << where;
    for (const Block& b : targets) {
      Result<HandleInfo> info = rig.pool->describe(b.handle);
      if (!info.ok()) continue;  // released
      EXPECT_TRUE(info->state == HandleState::kPooled ||
                  (info->state == HandleState::kQuarantined && release_failures > 0))
          << where << ": handle of released " << show(b) << " is " << to_string(info->state);
      EXPECT_EQ(info->mappings, 0u) << where << ": " << show(b);
    }
    if (c.max_pooled_bytes == kNoPoolBound) {
      EXPECT_EQ(after.pool.pooled_bytes, t.before.pool.pooled_bytes + len) << where;
      EXPECT_EQ(after.tier.used, t.before.tier.used) << where;
    }
  } else {
    // Residual: every target is either gone or still there, poisoned and named.
    EXPECT_EQ(t.status.code(), StatusCode::kDriverError) << where << ": " << t.status.to_string();
    EXPECT_TRUE(mentions(t.status, "poisoned")) << where << ": " << t.status.to_string();
    EXPECT_FALSE(left.empty()) << where << ": failed, yet nothing was left behind";
    EXPECT_EQ(reservation.residual_bytes(), bytes_of(left)) << where;
    EXPECT_GE(after.pool.handles_quarantined - t.before.pool.handles_quarantined, left.size())
        << where;
    for (const Block& b : left) {
      Block healthy = b;
      healthy.poisoned = false;
      const auto original = std::find_if(targets.begin(), targets.end(),
                                         [&](const Block& x) { return show(x) == show(healthy); });
      EXPECT_TRUE(b.poisoned && original != targets.end())
          << where << ": left behind " << show(b) << ", before " << show(targets);
      EXPECT_NE(t.status.message().find(range_text(b.offset, b.bytes)), std::string::npos)
          << where << ": " << show(b) << " not named in " << t.status.to_string();
      Result<HandleInfo> info = rig.pool->describe(b.handle);
      EXPECT_TRUE(info.ok() && info->state == HandleState::kQuarantined)
          << where << ": the handle of " << show(b) << " is not quarantined";
    }
  }
  EXPECT_EQ(verify_content(rig), "") << where;

  if (t.status.ok()) {
    // The addresses were kept: the range can be committed again.
    ASSERT_TRUE(commit_granules(rig, 0, 1, c.k, c.handle_granules).ok()) << where;
    fill(rig, 0, 1, c.k);
    ASSERT_EQ(kt::check_invariants(rig.world()), "") << where << ", recommitted";
    EXPECT_EQ(verify_content(rig), "") << where << ", recommitted";
  } else {
    // A poisoned block cannot be released again (and that refusal changes nothing); the
    // healthy neighbours still can.
    const State refused_before = capture(rig);
    const std::uint64_t calls_before = rig.fault->counts().total();
    for (const Block& b : left) {
      const Status again = reservation.release(b.offset, b.bytes);
      EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition)
          << where << ": releasing poisoned " << show(b) << " again: " << again.to_string();
    }
    EXPECT_EQ(rig.fault->counts().total(), calls_before) << where;
    EXPECT_EQ(show(reservation.blocks()), show(refused_before.blocks[0])) << where;
    EXPECT_EQ(rig.pool->snapshot().owned_bytes, refused_before.pool.owned_bytes) << where;
    EXPECT_TRUE(reservation.release(0, g).ok()) << where;
    EXPECT_TRUE(reservation.release((1 + c.k) * g, g).ok()) << where;
    ASSERT_EQ(kt::check_invariants(rig.world()), "") << where << ", neighbours released";
  }
}

Sweep release_sweep(const ReleaseCase& c) {
  Sweep sweep;
  sweep.name = c.name;
  sweep.max_pooled_bytes = c.max_pooled_bytes;
  sweep.setup = [c](Rig& rig) {
    add_reservation(rig, 16);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(commit_granules(rig, 0, 0, 1).ok());
    ASSERT_TRUE(commit_granules(rig, 0, 1, c.k, c.handle_granules).ok());
    ASSERT_TRUE(commit_granules(rig, 0, 1 + c.k, 1).ok());
    fill(rig, 0, 0, c.k + 2);
  };
  sweep.op = [c](Rig& rig) { return rig.at(0).release(rig.g, c.k * rig.g); };
  sweep.check = [c](Rig& rig, const Trial& t) {
    Outcome outcome = Outcome::kCompleted;
    check_release(rig, t, c, &outcome);
    return outcome;
  };
  if (c.failing_fallback) {
    // Position i: the coalesced unmap (call 1) fails and so does the per-block unmap of the
    // i-th block (unmap number 1 + i).
    sweep.arm = [](FaultDriver& fault, std::uint64_t position) {
      fault.fail_nth_call(1);
      fault.fail_nth(DriverOp::kUnmap, 1 + position);
    };
    sweep.count_positions = [](const Trial& clean) {
      return static_cast<std::uint64_t>(clean.before.blocks[0].size() - 2);
    };
    sweep.injections = 2;
  }
  return sweep;
}

// ---------------------------------------------------------------------------------------------
// Teardown: reservation 0 (8 granules) holds [0, 2) and [3, 5) (two runs of two handles);
// reservation 1 holds [0, 1) and maps reservation 0's first handle read-only at granule 2.
// The operation destroys reservation 0 with the default synchronizer (driver.synchronize(),
// so position 1 is the synchronize call).

struct TeardownCase {
  std::string name;
  std::uint64_t max_pooled_bytes = kNoPoolBound;
  bool with_poisoned = false;  // reservation 0 also holds a poisoned block at [6, 7)
};

void check_teardown(Rig& rig, const Trial& t, const TeardownCase& c, Outcome* outcome) {
  const std::string where = c.name + ", " + t.where();
  const std::size_t g = rig.g;
  const State after = capture(rig);
  TeardownStats d;
  d.leaked_reservations =
      after.teardown.leaked_reservations - t.before.teardown.leaked_reservations;
  d.leaked_blocks = after.teardown.leaked_blocks - t.before.teardown.leaked_blocks;
  d.leaked_bytes = after.teardown.leaked_bytes - t.before.teardown.leaked_bytes;
  d.leaked_address_bytes =
      after.teardown.leaked_address_bytes - t.before.teardown.leaked_address_bytes;
  d.free_failures = after.teardown.free_failures - t.before.teardown.free_failures;
  const std::vector<Block>& torn = t.before.blocks[0];
  std::size_t poisoned = 0;
  for (const Block& b : torn) poisoned += b.poisoned ? 1 : 0;

  // What the teardown reports it left behind is what the world must account for.
  rig.leaked_mappings = d.leaked_blocks;
  rig.leaked_reservations = d.leaked_address_bytes / (8 * g);
  EXPECT_EQ(d.leaked_address_bytes % (8 * g), 0u) << where;
  ASSERT_EQ(kt::check_invariants(rig.world()), "") << where;

  const bool sync_failed = t.calls.failed(DriverOp::kSynchronize) > 0;
  if (t.position == 1) {
    EXPECT_TRUE(sync_failed) << where << ": position 1 of a teardown is not its synchronize";
  }
  *outcome = sync_failed ? Outcome::kLeaked : Outcome::kCompleted;
  if (sync_failed) {
    // Deliberately leaked: nothing unmapped, released, reused or reported free; counted.
    EXPECT_EQ(d.leaked_reservations, 1u) << where;
    EXPECT_EQ(d.leaked_blocks, torn.size()) << where;
    EXPECT_EQ(d.leaked_bytes, bytes_of(torn)) << where;
    EXPECT_EQ(d.leaked_address_bytes, 8 * g) << where;
    EXPECT_EQ(t.calls.total(), 1u) << where << ": driver calls after a failed synchronize";
    if (rig.real->info().backend == "host") {
      EXPECT_EQ(after.tables.mappings, t.before.tables.mappings) << where;
      EXPECT_EQ(after.tables.reservations, t.before.tables.reservations) << where;
      EXPECT_EQ(after.tables.handles, t.before.tables.handles) << where;
    }
    EXPECT_EQ(after.pool.handles_in_use, t.before.pool.handles_in_use) << where;
    EXPECT_EQ(after.pool.mapped_bytes, t.before.pool.mapped_bytes) << where;
    EXPECT_EQ(after.pool.owned_bytes, t.before.pool.owned_bytes) << where;
    EXPECT_EQ(after.tier.used, t.before.tier.used) << where;
    for (const Block& b : torn) {
      Result<HandleInfo> info = rig.pool->describe(b.handle);
      EXPECT_TRUE(info.ok() && info->state != HandleState::kPooled && info->mappings > 0)
          << where << ": a leaked block's handle is reusable: " << show(b);
    }
  } else {
    EXPECT_EQ(d.leaked_reservations, 0u) << where;
    // Only the blocks that were already poisoned stay behind (a single fault in the unmap
    // is absorbed by the per-block fallback).
    EXPECT_EQ(d.leaked_blocks, poisoned) << where;
    const bool free_failed = t.calls.failed(DriverOp::kFree) > 0;
    EXPECT_EQ(d.free_failures, free_failed ? 1u : 0u) << where;
    EXPECT_EQ(d.leaked_address_bytes, (poisoned > 0 || free_failed) ? 8 * g : 0u) << where;
    for (const Block& b : torn) {
      Result<HandleInfo> info = rig.pool->describe(b.handle);
      if (b.poisoned) {
        EXPECT_TRUE(info.ok() && info->state == HandleState::kQuarantined) << where << show(b);
      } else if (b.offset == 0) {
        // Still mapped by the sharer: in use, one mapping.
        ASSERT_TRUE(info.ok()) << where << ": the shared handle was released";
        EXPECT_EQ(info->state, HandleState::kInUse) << where;
        EXPECT_EQ(info->mappings, 1u) << where;
      } else if (info.ok()) {
        EXPECT_TRUE(info->state == HandleState::kPooled ||
                    (info->state == HandleState::kQuarantined &&
                     after.pool.release_failures > t.before.pool.release_failures))
            << where << ": handle of " << show(b) << " is " << to_string(info->state);
      }
    }
  }
  // The sharer is untouched and still reads the owner's bytes through its shared block.
  EXPECT_EQ(show(after.blocks[1]), show(t.before.blocks[1])) << where;
  EXPECT_EQ(verify_content(rig), "") << where;
}

Sweep teardown_sweep(const TeardownCase& c) {
  Sweep sweep;
  sweep.name = c.name;
  sweep.max_pooled_bytes = c.max_pooled_bytes;
  sweep.setup = [c](Rig& rig) {
    add_reservation(rig, 8);
    add_reservation(rig, 8);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(commit_granules(rig, 0, 0, 2).ok());
    ASSERT_TRUE(commit_granules(rig, 0, 3, 2).ok());
    ASSERT_TRUE(commit_granules(rig, 1, 0, 1).ok());
    fill(rig, 0, 0, 2);
    fill(rig, 0, 3, 2);
    fill(rig, 1, 0, 1);
    Result<HandleInfo> info = rig.pool->describe(rig.at(0).block_at(0)->handle);
    ASSERT_TRUE(info.ok());
    ASSERT_TRUE(rig.at(1).map_shared(2 * rig.g, *info).ok());
    share_seeds(rig, 0, 0, 1, 2, 1);
    if (c.with_poisoned) {
      ASSERT_TRUE(commit_granules(rig, 0, 6, 1).ok());
      fill(rig, 0, 6, 1);
      rig.fault->fail_nth_call(1);               // the coalesced unmap
      rig.fault->fail_nth(DriverOp::kUnmap, 2);  // and the per-block one
      const Status released = rig.at(0).release(6 * rig.g, rig.g);
      rig.fault->clear();
      ASSERT_TRUE(mentions(released, "poisoned")) << released.to_string();
      ASSERT_EQ(rig.at(0).residual_bytes(), rig.g);
    }
  };
  sweep.op = [](Rig& rig) {
    rig.reservations[0].reset();
    return Status::Ok();
  };
  sweep.check = [c](Rig& rig, const Trial& t) {
    if (t.position == 0) {
      EXPECT_EQ(t.calls.of(DriverOp::kSynchronize), 1u) << c.name;
    }
    Outcome outcome = Outcome::kCompleted;
    check_teardown(rig, t, c, &outcome);
    return outcome;
  };
  return sweep;
}

// ---------------------------------------------------------------------------------------------
// The typed suite.

template <typename B>
class FaultSweepTest : public ::testing::Test {
 protected:
  // Skips the CUDA instantiation without a GPU. Each trial makes its own driver (see the top
  // of this file); this one only proves the backend is there.
  void SetUp() override { KVVM_MAKE_DRIVER_OR_SKIP(B, real_); }

  std::unique_ptr<Driver> real_;
};

TYPED_TEST_SUITE(FaultSweepTest, kt::AllBackends, kt::BackendNames);

// Single faults: every rollback succeeds, so every faulted commit restores the prior state.
TYPED_TEST(FaultSweepTest, CommitOneGranule) {
  const SweepResult r = run_sweep<TypeParam>(commit_sweep({.name = "commit k=1", .k = 1}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitTwoGranules) {
  const SweepResult r = run_sweep<TypeParam>(commit_sweep({.name = "commit k=2", .k = 2}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitFiveGranules) {
  const SweepResult r = run_sweep<TypeParam>(commit_sweep({.name = "commit k=5", .k = 5}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitFiveGranulesInTwoGranuleHandles) {
  const SweepResult r = run_sweep<TypeParam>(
      commit_sweep({.name = "commit k=5, 2-granule handles", .k = 5, .handle_granules = 2}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitFiveGranulesFromWarmPool) {
  const SweepResult r =
      run_sweep<TypeParam>(commit_sweep({.name = "commit k=5, warm pool", .k = 5, .warm = true}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitFiveGranulesPoolKeepsNothing) {
  const SweepResult r = run_sweep<TypeParam>(
      commit_sweep({.name = "commit k=5, pool bound 0", .k = 5, .max_pooled_bytes = 0}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

// Double faults: a fault at position i and the rollback's first unmap. Whenever something
// was mapped before the fault (4 failing maps after the first, and the set_access) the
// residual must be reported; otherwise the state is restored.
TYPED_TEST(FaultSweepTest, CommitRollbackWithFailingUnmapReportsResidual) {
  const SweepResult r = run_sweep<TypeParam>(
      commit_sweep({.name = "commit k=5, failing rollback unmap", .k = 5, .failing_undo = true}));
  EXPECT_EQ(r.count(Outcome::kResidual), 5u);
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions - 5);
}

// Three ranges, one transaction: 5 creates, 5 maps, 3 set_access calls.
TYPED_TEST(FaultSweepTest, CommitRanges) {
  const SweepResult r = run_sweep<TypeParam>(
      commit_sweep({.name = "commit_ranges 2+1+2", .ranges = {{2, 2}, {5, 1}, {7, 2}}}));
  EXPECT_EQ(r.positions, 13u);
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitRangesWithFailingUnmapReportsResidual) {
  const SweepResult r =
      run_sweep<TypeParam>(commit_sweep({.name = "commit_ranges 2+1+2, failing rollback unmap",
                                         .failing_undo = true,
                                         .ranges = {{2, 2}, {5, 1}, {7, 2}}}));
  EXPECT_EQ(r.count(Outcome::kResidual), 7u);  // maps 2..5 and the 3 set_access calls
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions - 7);
}

TYPED_TEST(FaultSweepTest, MapShared) {
  const SweepResult r = run_sweep<TypeParam>(share_sweep({.name = "map_shared"}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, MapSharedPartOfHandle) {
  if (!this->real_->maps_handle_subranges()) {
    // This driver maps whole handles only (CUDA): the call is refused before any driver call.
    std::unique_ptr<Rig> rig = make_rig<TypeParam>(kNoPoolBound);
    ASSERT_TRUE(rig != nullptr);
    share_sweep({.name = "map_shared part", .handle_granules = 3}).setup(*rig);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    const State before = capture(*rig);
    const std::uint64_t calls = rig->fault->counts().total();
    Result<HandleInfo> info = rig->pool->describe(rig->at(0).block_at(0)->handle);
    ASSERT_TRUE(info.ok());
    const Status status =
        rig->at(1).map_shared(2 * rig->g, *info, Access::kReadOnly, rig->g, rig->g);
    EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.to_string();
    EXPECT_EQ(rig->fault->counts().total(), calls);
    EXPECT_EQ(show(rig->at(1).blocks()), show(before.blocks[1]));
    EXPECT_EQ(kt::check_invariants(rig->world()), "");
    GTEST_SKIP() << "this driver maps whole handles only; the refusal was checked instead";
  }
  const SweepResult r =
      run_sweep<TypeParam>(share_sweep({.name = "map_shared part of a 3-granule handle",
                                        .handle_granules = 3,
                                        .handle_offset_granules = 1,
                                        .granules = 1}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

// The map fails (restored), or set_access fails and so does the withdrawing unmap (residual).
TYPED_TEST(FaultSweepTest, MapSharedWithFailingWithdraw) {
  const SweepResult r = run_sweep<TypeParam>(share_sweep(
      {.name = "map_shared, failing withdraw", .handle_granules = 2, .failing_undo = true}));
  EXPECT_EQ(r.count(Outcome::kRestored), 1u);
  EXPECT_EQ(r.count(Outcome::kResidual), 1u);
}

// A single failing unmap is absorbed by the per-block fallback (and a failing release of a
// handle above the pool bound by quarantining it): every faulted release completes.
TYPED_TEST(FaultSweepTest, ReleaseOneGranule) {
  const SweepResult r = run_sweep<TypeParam>(release_sweep({.name = "release k=1", .k = 1}));
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions);
}

TYPED_TEST(FaultSweepTest, ReleaseTwoGranules) {
  const SweepResult r = run_sweep<TypeParam>(release_sweep({.name = "release k=2", .k = 2}));
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions);
}

TYPED_TEST(FaultSweepTest, ReleaseFiveGranules) {
  const SweepResult r = run_sweep<TypeParam>(release_sweep({.name = "release k=5", .k = 5}));
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions);
}

TYPED_TEST(FaultSweepTest, ReleaseFiveGranulesInTwoGranuleHandles) {
  const SweepResult r = run_sweep<TypeParam>(
      release_sweep({.name = "release k=5, 2-granule handles", .k = 5, .handle_granules = 2}));
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions);
}

TYPED_TEST(FaultSweepTest, ReleaseFiveGranulesPoolKeepsNothing) {
  const SweepResult r = run_sweep<TypeParam>(
      release_sweep({.name = "release k=5, pool bound 0", .k = 5, .max_pooled_bytes = 0}));
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions);
}

// The coalesced unmap fails and so does the per-block unmap of block i: residual each time.
TYPED_TEST(FaultSweepTest, ReleaseWithFailingFallbackReportsResidual) {
  const SweepResult r = run_sweep<TypeParam>(release_sweep(
      {.name = "release k=5, failing fallback unmap", .k = 5, .failing_fallback = true}));
  EXPECT_EQ(r.positions, 5u);
  EXPECT_EQ(r.count(Outcome::kResidual), r.positions);
}

// Position 1 (the synchronize) leaks deliberately; every other fault is absorbed.
TYPED_TEST(FaultSweepTest, Teardown) {
  const SweepResult r = run_sweep<TypeParam>(teardown_sweep({.name = "teardown"}));
  EXPECT_EQ(r.count(Outcome::kLeaked), 1u);
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions - 1);
}

TYPED_TEST(FaultSweepTest, TeardownPoolKeepsNothing) {
  const SweepResult r = run_sweep<TypeParam>(
      teardown_sweep({.name = "teardown, pool bound 0", .max_pooled_bytes = 0}));
  EXPECT_EQ(r.count(Outcome::kLeaked), 1u);
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions - 1);
}

TYPED_TEST(FaultSweepTest, TeardownWithPoisonedBlock) {
  const SweepResult r = run_sweep<TypeParam>(
      teardown_sweep({.name = "teardown with a poisoned block", .with_poisoned = true}));
  EXPECT_EQ(r.count(Outcome::kLeaked), 1u);
  EXPECT_EQ(r.count(Outcome::kCompleted), r.positions - 1);
}

}  // namespace
}  // namespace kvvm
