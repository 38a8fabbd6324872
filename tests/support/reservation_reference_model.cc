// The reference model of Reservation: plumbing, creation and destruction, content tags and
// the checks after every operation.
#include "support/reservation_reference_model.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"
#include "kvvm/vmm/reservation.h"
#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm::testing::reservation_model {

using kt::mix;

std::ostream& operator<<(std::ostream& os, const OpSpec& op) {
  return os << "{" << op.kind << " " << op.a << " " << op.b << " " << op.c << " " << op.d << " "
            << op.e << " " << op.fault_seed << "}";
}

ShrinkBudget& shrink_budget() {
  static ShrinkBudget budget;
  return budget;
}

Totals& totals() {
  static Totals t;
  return t;
}

namespace {

class TotalsReport : public ::testing::Environment {
 public:
  void TearDown() override {
    const Totals& t = totals();
    if (t.runs == 0) return;
    std::cout << "[ model ] " << t.ops << " operations in " << t.runs << " runs\n";
    for (const auto& [what, count] : t.outcomes) {
      std::cout << "[ model ]   " << what << ": " << count << "\n";
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kTotalsReport =
    ::testing::AddGlobalTestEnvironment(new TotalsReport);

}  // namespace

bool same(const Block& actual, std::size_t offset, const ModelBlock& model) {
  return actual.offset == offset && actual.bytes == model.bytes && actual.handle == model.handle &&
         actual.handle_offset == model.handle_offset && actual.access == model.access &&
         actual.shared == model.shared && actual.poisoned == model.poisoned;
}

std::string show(std::size_t offset, const ModelBlock& b) {
  std::ostringstream text;
  text << "[" << offset << ", " << offset + b.bytes << ") h" << b.handle << "+" << b.handle_offset
       << " " << to_string(b.access) << (b.shared ? " shared" : "")
       << (b.poisoned ? " POISONED" : "");
  return text.str();
}

std::string show(const Block& b) {
  return show(b.offset,
              ModelBlock{b.bytes, b.handle, b.handle_offset, b.access, b.shared, b.poisoned});
}

ModelRun::ModelRun(std::uint64_t seed) : seed_(seed) {
  auto driver = make_host_driver();
  RC_ASSERT(driver.ok());
  real_ = std::move(driver).value();
  fault_ = std::make_unique<FaultDriver>(*real_);
  g_ = real_->granule();
  tier_ = governor_.add_tier("model", kTierGranules * g_);
  pool_ = std::make_unique<HandlePool>(*fault_, PoolOptions{.max_pooled_bytes = kPoolGranules * g_},
                                       &governor_, tier_);
}

void ModelRun::run(const std::vector<OpSpec>& ops) {
  ops_ = &ops;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    index_ = i;
    arm_faults(ops[i]);
    apply(ops[i]);
    fault_->clear();
    ++totals().ops;
    check_all();
  }
  // Tear everything down without faults: the leaks are exactly the counted ones.
  index_ = ops.size();
  fail_sync_ = false;
  while (!live_.empty()) {
    destroy(live_.size() - 1, false);
    check_all();
  }
  const PoolSnapshot pool = pool_->snapshot();
  totals().outcomes["pool: handles created"] += pool.creates;
  totals().outcomes["pool: hits"] += pool.pool_hits;
  totals().outcomes["pool: released (above its bound, trimmed or rolled back)"] += pool.releases;
  totals().outcomes["pool: release failures"] += pool.release_failures;
  totals().outcomes["governor: refusals"] += governor_.stats(tier_).refusals;
  if (leaked_mappings_ == 0 && pool.handles_in_use != 0) {
    fail("after tearing everything down " + std::to_string(pool.handles_in_use) +
         " handles are still in use, with no deliberate leak");
  }
}

void ModelRun::arm_faults(const OpSpec& op) {
  for (std::size_t i = 0; i < kFaultedOps.size(); ++i) {
    fault_->fail_fraction(kFaultedOps[i], kFaultFraction, mix(op.fault_seed + i) ^ seed_);
  }
}

void ModelRun::note(std::string what) {
  trace_.push_back(std::move(what));
  if (trace_.size() > 24) trace_.pop_front();
}

kt::World ModelRun::world() {
  kt::World world;
  world.driver = fault_.get();
  world.real_driver = real_.get();
  world.pool = pool_.get();
  world.governor = &governor_;
  world.tier = tier_;
  for (const ModelReservation& m : live_) world.reservations.push_back(m.reservation.get());
  world.leaked_mappings = leaked_mappings_;
  world.leaked_reservations = leaked_reservations_;
  return world;
}

ModelRun::Snapshot ModelRun::snapshot() const {
  return Snapshot{pool_->snapshot(), governor_.stats(tier_), fault_->counts().total()};
}

void ModelRun::expect_unchanged(const Snapshot& before, const std::string& what) {
  const Snapshot after = snapshot();
  if (after.calls != before.calls) {
    fail(what + ": refused, yet made " + std::to_string(after.calls - before.calls) +
         " driver call(s)");
  }
  const PoolSnapshot& a = after.pool;
  const PoolSnapshot& b = before.pool;
  if (a.owned_bytes != b.owned_bytes || a.mapped_bytes != b.mapped_bytes ||
      a.pooled_bytes != b.pooled_bytes || a.quarantined_bytes != b.quarantined_bytes ||
      a.creates != b.creates || a.releases != b.releases) {
    fail(what + ": refused, yet the pool changed");
  }
  if (after.tier.used != before.tier.used) fail(what + ": refused, yet the ledger changed");
}

bool ModelRun::is_refusal(const Status& status) {
  return status.code() == StatusCode::kInvalidArgument ||
         status.code() == StatusCode::kFailedPrecondition;
}

bool ModelRun::range_ok(const ModelReservation& m, std::size_t offset, std::size_t len) const {
  return len > 0 && offset % g_ == 0 && len % g_ == 0 && offset <= m.granules * g_ &&
         len <= m.granules * g_ - offset;
}

bool ModelRun::free_in_model(const ModelReservation& m, std::size_t offset, std::size_t len) const {
  for (const auto& [at, block] : m.blocks) {
    if (at < offset + len && offset < at + block.bytes) return false;
  }
  return true;
}

Coverage ModelRun::coverage(const ModelReservation& m, std::size_t offset, std::size_t len) const {
  if (!range_ok(m, offset, len)) return Coverage::kInvalid;
  bool poisoned = false;
  for (const auto& [at, block] : m.blocks) {
    const bool overlaps = at < offset + len && offset < at + block.bytes;
    if (!overlaps) continue;
    if (at < offset || at + block.bytes > offset + len) return Coverage::kInvalid;  // cut
    poisoned = poisoned || block.poisoned;
  }
  for (std::size_t at = offset; at < offset + len; at += g_) {
    if (block_at(m, at) == m.blocks.end()) return Coverage::kInvalid;  // a hole
  }
  return poisoned ? Coverage::kPoisoned : Coverage::kCovered;
}

std::map<std::size_t, ModelBlock>::const_iterator ModelRun::block_at(const ModelReservation& m,
                                                                     std::size_t offset) const {
  auto it = m.blocks.upper_bound(offset);
  if (it == m.blocks.begin()) return m.blocks.end();
  --it;
  return offset < it->first + it->second.bytes ? it : m.blocks.end();
}

std::pair<std::size_t, std::size_t> ModelRun::free_run(const ModelReservation& m,
                                                       std::size_t start) const {
  for (std::size_t step = 0; step < m.granules; ++step) {
    const std::size_t w = (start + step) % m.granules;
    if (block_at(m, w * g_) != m.blocks.end()) continue;
    std::size_t n = 0;
    while (w + n < m.granules && block_at(m, (w + n) * g_) == m.blocks.end()) ++n;
    return {w, n};
  }
  return {0, 0};
}

void ModelRun::apply(const OpSpec& op) {
  const bool full = live_.size() >= kMaxReservations;
  if (live_.empty() || (op.kind < 7 && (!full || op.b % 10 == 0))) {
    create(op);
  } else if (op.kind < 7) {
    commit(op);  // a create with every reservation taken
  } else if (op.kind < 10) {
    destroy(op.a % live_.size(), op.b % 5 == 0);
  } else if (op.kind < 45) {
    commit(op);
  } else if (op.kind < 67) {
    release(op);
  } else if (op.kind < 85) {
    map_shared(op);
  } else {
    set_access(op);
  }
}

void ModelRun::create(const OpSpec& op) {
  const bool bad = op.b % 10 == 0;
  std::size_t bytes = (kMinGranules + op.a % (kMaxGranules - kMinGranules + 1)) * g_;
  if (bad) bytes = op.c % 2 == 0 ? 0 : bytes + g_ / 2;
  const std::string what = "create " + std::to_string(bytes) + " bytes";
  note(what);
  const Snapshot before = snapshot();
  ReservationOptions options;
  options.teardown_synchronizer = [this] {
    return fail_sync_ ? Status::Unavailable("model: the synchronizer fails this time")
                      : fault_->synchronize();
  };
  auto created = Reservation::create(*pool_, bytes, options);
  if (bad) {
    if (created.ok() || created.status().code() != StatusCode::kInvalidArgument) {
      fail(what + ": expected InvalidArgument, got " + created.status().to_string());
    }
    expect_unchanged(before, what);
    count("create refused");
    return;
  }
  if (!created.ok()) fail(what + ": " + created.status().to_string());
  if (created.value()->size() != bytes || created.value()->base() % g_ != 0) {
    fail(what + ": wrong size or misaligned base");
  }
  live_.push_back(ModelReservation{std::move(created).value(), bytes / g_, {}});
  count("create ok");
}

void ModelRun::destroy(std::size_t r, bool fail_sync) {
  ModelReservation& m = live_[r];
  const std::string what = "destroy r" + std::to_string(r) + " with " +
                           std::to_string(m.blocks.size()) + " blocks" +
                           (fail_sync ? ", synchronizer fails" : "");
  note(what);
  std::size_t poisoned = 0;
  std::uint64_t mapped = 0;
  std::vector<Handle> handles;
  for (const auto& [at, block] : m.blocks) {
    poisoned += block.poisoned ? 1 : 0;
    mapped += block.bytes;
    handles.push_back(block.handle);
  }
  const std::size_t blocks = m.blocks.size();
  const std::size_t size = m.granules * g_;
  const Address base = m.reservation->base();
  const TeardownStats before = teardown_stats();
  fail_sync_ = fail_sync;
  live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(r));  // runs the destructor
  fail_sync_ = false;
  const TeardownStats after = teardown_stats();
  const std::uint64_t leaked_reservations = after.leaked_reservations - before.leaked_reservations;
  const std::uint64_t leaked_blocks = after.leaked_blocks - before.leaked_blocks;
  const std::uint64_t leaked_addresses = after.leaked_address_bytes - before.leaked_address_bytes;

  if (blocks > 0 && fail_sync) {
    // Deliberately leaked: nothing unmapped, everything counted.
    if (leaked_reservations != 1 || leaked_blocks != blocks || leaked_addresses != size ||
        after.leaked_bytes - before.leaked_bytes != mapped) {
      fail(what + ": the leak was not counted as one reservation with all its blocks");
    }
    count("destroy leaked (sync failed)");
  } else {
    // Only blocks that were poisoned already, or whose unmap failed now, stay behind.
    if (leaked_reservations != 0 || leaked_blocks < poisoned || leaked_blocks > blocks) {
      fail(what + ": counted " + std::to_string(leaked_reservations) + " leaked reservations and " +
           std::to_string(leaked_blocks) + " leaked blocks");
    }
    const bool range_kept = leaked_blocks > 0 || after.free_failures > before.free_failures;
    if (leaked_addresses != (range_kept ? size : 0)) {
      fail(what + ": leaked address bytes " + std::to_string(leaked_addresses));
    }
    count(leaked_blocks > poisoned ? "destroy left poisoned blocks" : "destroy ok");
  }
  leaked_mappings_ += leaked_blocks;
  leaked_reservations_ += leaked_addresses / size;
  if (leaked_addresses > 0) leaked_ranges_.emplace_back(base, size);
  // A block whose unmap failed during teardown quarantined its handle (which another live
  // reservation may share): learn which.
  for (Handle handle : handles) {
    Result<HandleInfo> info = pool_->describe(handle);
    if (info.ok() && info->state == HandleState::kQuarantined) quarantined_.insert(handle);
  }
}

std::string ModelRun::show_ranges(const std::vector<Range>& ranges) {
  std::string text;
  for (const Range& range : ranges) {
    text += (text.empty() ? "[" : " [") + std::to_string(range.offset) + ", +" +
            std::to_string(range.len) + ")";
  }
  return text;
}

void ModelRun::check_writable(const Reservation& reservation, const Range& range,
                              const std::string& result) {
  const Address begin = reservation.base() + range.offset;
  for (const kt::MapsLine& line : kt::read_maps(begin, begin + range.len)) {
    if (line.perms != "rw-s") {
      fail(result + ": committed, yet mapped " + line.perms + " " + line.path);
    }
  }
}

void ModelRun::write_tags(const Reservation& reservation, std::size_t offset, const Block& block) {
  std::vector<std::uint64_t>& tags = tags_[block.handle];
  tags.assign(block.bytes / g_, 0);
  for (std::size_t w = 0; w < tags.size(); ++w) {
    tags[w] = mix(seed_ ^ (++next_tag_ << 1));
    const Status written =
        real_->write(reservation.base() + offset + w * g_, &tags[w], sizeof(tags[w]));
    if (!written.ok()) fail("writing a tag: " + written.to_string());
  }
}

void ModelRun::check_all() {
  const std::string problems = kt::check_invariants(world());
  if (!problems.empty()) fail("invariants:\n" + problems);
  for (std::size_t r = 0; r < live_.size(); ++r) {
    const ModelReservation& m = live_[r];
    const std::vector<Block> blocks = m.reservation->blocks();
    std::uint64_t residual = 0;
    bool equal = blocks.size() == m.blocks.size();
    auto model = m.blocks.begin();
    for (std::size_t i = 0; equal && i < blocks.size(); ++i, ++model) {
      equal = same(blocks[i], model->first, model->second);
    }
    for (const auto& [at, block] : m.blocks) residual += block.poisoned ? block.bytes : 0;
    if (!equal || m.reservation->residual_bytes() != residual) {
      std::string text = "r" + std::to_string(r) + " differs from the model\n  actual:";
      for (const Block& b : blocks) text += " " + show(b);
      text += "\n  model: ";
      for (const auto& [at, b] : m.blocks) text += " " + show(at, b);
      fail(text);
    }
    // Every healthy accessible window reads its handle's tag.
    for (const auto& [at, block] : m.blocks) {
      if (block.poisoned || block.access == Access::kNone) continue;
      const std::vector<std::uint64_t>& tags = tags_.at(block.handle);
      for (std::size_t w = 0; w < block.bytes / g_; ++w) {
        std::uint64_t tag = 0;
        const Status read = real_->read(&tag, m.reservation->base() + at + w * g_, sizeof(tag));
        const std::uint64_t expected = tags.at(block.handle_offset / g_ + w);
        if (!read.ok() || tag != expected) {
          fail("r" + std::to_string(r) + " window " + std::to_string(at + w * g_) + " of " +
               show(at, block) + " reads " + std::to_string(tag) + ", its owner wrote " +
               std::to_string(expected) + " " + read.to_string());
        }
      }
    }
  }
  if (pool_->snapshot().handles_quarantined < quarantined_.size()) {
    fail("the pool quarantines fewer handles than were reported poisoned");
  }
}

}  // namespace kvvm::testing::reservation_model
