// The reference model of Arena: setup, the run, plumbing, observing and reconciling the arena,
// content tags and the checks after every operation.
#include "support/arena_reference_model.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/layout.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"
#include "kvvm/vmm/reservation.h"
#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm::testing::arena_model {

using kt::mix;

std::uint64_t windows_per_fragment_of(Layout layout) {
  switch (layout) {
    case Layout::kTokenMajor:
      return 12;  // 1 fragment
    case Layout::kSeqMajor:
      return 3;  // 4 fragments
    case Layout::kHeadMajor:
      return 2;  // 8 fragments
  }
  return 1;
}

std::ostream& operator<<(std::ostream& os, const OpSpec& op) {
  return os << "{" << op.kind << " " << op.a << " " << op.b << " " << op.c << " " << op.fault_seed
            << "}";
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
    std::cout << "[ arena model ] " << t.ops << " operations in " << t.runs << " runs:";
    for (const auto& [what, count] : t.outcomes) std::cout << " " << what << "=" << count;
    std::cout << "\n";
  }
};
[[maybe_unused]] ::testing::Environment* const kTotalsReport =
    ::testing::AddGlobalTestEnvironment(new TotalsReport);

}  // namespace

const char* name(State state) {
  switch (state) {
    case State::kFree:
      return "free";
    case State::kActive:
      return "active";
    case State::kFinished:
      return "finished";
    case State::kQuarantined:
      return "quarantined";
  }
  return "?";
}

void ModelRun::run(const std::vector<OpSpec>& ops) {
  check_all();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    index_ = i;
    const OpSpec& op = ops[i];
    op_begin(op.fault_seed);
    arm(op.fault_seed, op.fault_seed % 4 != 0);  // one operation in four runs clean
    apply(op);
    fault_->clear();
    ++totals().ops;
    check_all();
  }
  // Tear down without faults: end any capture, let the worker settle, then destroy the arena.
  index_ = ops.size();
  if (guard_) {
    note("end capture (teardown)");
    guard_.reset();
    settle(0);
    reconcile();
    check_all();
  }
  const Address base = arena_->reservation().base();
  const std::size_t size = arena_->reservation().size();
  const TeardownStats before = teardown_stats();
  arena_.reset();
  const TeardownStats after = teardown_stats();
  leaked_mappings_ = after.leaked_blocks - before.leaked_blocks;
  const std::uint64_t leaked_addresses = after.leaked_address_bytes - before.leaked_address_bytes;
  leaked_reservations_ = leaked_addresses / size;
  if (leaked_addresses > 0) leaked_ranges_.emplace_back(base, size);
  if ((quarantined_count() == 0) != (leaked_mappings_ == 0)) {
    fail("teardown left " + std::to_string(leaked_mappings_) + " blocks mapped with " +
         std::to_string(quarantined_count()) + " quarantined slot(s)");
  }
  const std::string problems = kt::check_invariants(world());
  if (!problems.empty()) fail("after the arena's teardown:\n" + problems);
}

void ModelRun::arm(std::uint64_t seed, bool faults) {
  fault_->clear();
  if (!faults) return;
  for (std::size_t i = 0; i < kFaultedOps.size(); ++i) {
    fault_->fail_fraction(kFaultedOps[i], kFaultFraction, mix(seed + i) ^ seed_);
  }
}

void ModelRun::settle(std::uint64_t seed) {
  if (ahead_ == 0 || guard_) return;
  arm(mix(seed ^ 0x5e771e), true);
  arena_->wait_until_idle();
  fault_->clear();
}

void ModelRun::note(std::string what) {
  trace_.push_back(std::move(what));
  if (trace_.size() > 24) trace_.pop_front();
}

kt::World ModelRun::world() const {
  kt::World world;
  world.driver = fault_.get();
  world.real_driver = real_.get();
  world.pool = pool_.get();
  world.governor = const_cast<Governor*>(&governor_);
  world.tier = tier_;
  if (arena_) world.reservations = arena_->reservations();
  world.leaked_mappings = leaked_mappings_;
  world.leaked_reservations = leaked_reservations_;
  return world;
}

std::uint64_t ModelRun::ahead_target(const ModelSlot& m) const {
  return std::min(wpf(m.tokens) + ahead_, max_windows_);
}

std::size_t ModelRun::quarantined_count() const {
  return static_cast<std::size_t>(std::count_if(
      slots_.begin(), slots_.end(), [](const auto& m) { return m.state == State::kQuarantined; }));
}

std::uint64_t ModelRun::memory_calls() const {
  const DriverCallCounts calls = fault_->counts();
  return calls.of(DriverOp::kMap) + calls.of(DriverOp::kUnmap) + calls.of(DriverOp::kSetAccess) +
         calls.of(DriverOp::kCreate) + calls.of(DriverOp::kRelease);
}

void ModelRun::expect_no_driver_call(std::uint64_t calls_before, const std::string& result) {
  const std::uint64_t made = fault_->counts().total() - calls_before;
  if (made != 0) fail(result + ": refused, yet made " + std::to_string(made) + " driver call(s)");
}

void ModelRun::expect_code(const Status& status, StatusCode code, const std::string& result) {
  if (status.code() != code)
    fail(result + " (expected code " + std::to_string(static_cast<int>(code)) + ")");
}

std::uint64_t ModelRun::headroom(std::size_t target) const {
  const TierStats tier = governor_.stats(tier_);
  std::uint64_t bytes = tier.limit - tier.used + pool_->snapshot().pooled_bytes;
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    const ModelSlot& m = slots_[s];
    if (s == target) continue;
    if (m.state == State::kFinished) bytes += m.windows * window_bytes();
    if (m.state == State::kActive) bytes += (m.windows - wpf(m.tokens)) * window_bytes();
  }
  return bytes;
}

ModelRun::Observed ModelRun::observe() const {
  const std::uint64_t slot_windows = fragments_ * max_windows_;
  std::vector<std::vector<bool>> mapped(kSlots, std::vector<bool>(slot_windows, false));
  Observed seen;
  for (const Block& block : arena_->reservation().blocks()) {
    for (std::size_t at = block.offset; at < block.offset + block.bytes; at += g_) {
      const std::size_t slot = at / plan_.slot_stride;
      const std::size_t window = (at % plan_.slot_stride) / g_;
      if (slot >= kSlots) continue;
      mapped[slot][window] = true;
      if (block.poisoned) seen.poisoned[slot] = true;
    }
  }
  for (std::size_t s = 0; s < kSlots; ++s) {
    std::optional<std::uint64_t> common;
    bool prefix = true;
    std::string shape;
    for (std::uint64_t f = 0; f < fragments_; ++f) {
      std::uint64_t length = 0;
      while (length < max_windows_ && mapped[s][f * max_windows_ + length]) ++length;
      for (std::uint64_t w = length; w < max_windows_; ++w) {
        if (mapped[s][f * max_windows_ + w]) prefix = false;
      }
      if (common && *common != length) prefix = false;
      common = length;
      shape += (f ? "," : "") + std::to_string(length);
    }
    seen.windows.push_back(prefix ? common : std::nullopt);
    seen.shape.push_back(shape);
  }
  return seen;
}

void ModelRun::reconcile(const Leeway& leeway) {
  const Observed seen = observe();
  for (std::size_t s = 0; s < kSlots; ++s) {
    ModelSlot& m = slots_[s];
    const std::string where = "slot " + std::to_string(s) + " (" + name(m.state) + ", " +
                              std::to_string(m.tokens) + " tokens, " + std::to_string(m.windows) +
                              " windows)";
    if (m.state == State::kQuarantined) {
      if (!seen.poisoned[s]) fail(where + ": quarantined, but no poisoned block left under it");
      continue;
    }
    if (seen.poisoned[s]) {
      const bool candidate = (m.state == State::kFinished && m.windows > 0) ||
                             (m.state == State::kActive && m.windows > wpf(m.tokens));
      const bool allowed = leeway.target == s || leeway.released == s ||
                           (leeway.reclaimable && candidate) ||
                           (ahead_ > 0 && m.state == State::kActive);
      if (!allowed) fail(where + ": poisoned blocks appeared under it");
      m.state = State::kQuarantined;
      count("slot quarantined");
      continue;
    }
    if (!seen.windows[s]) {
      fail(where + ": mapped windows per fragment are not one common prefix: " + seen.shape[s]);
    }
    const std::uint64_t w = *seen.windows[s];
    if (w == m.windows) continue;
    bool allowed = false;
    if (m.state == State::kFinished) {
      allowed = (leeway.reclaimable || leeway.released == s) && m.windows > 0 && w == 0;
      if (allowed) {
        m.state = State::kFree;
        count("finished slot reclaimed");
      }
    } else if (m.state == State::kActive) {
      const std::uint64_t live = wpf(m.tokens);
      allowed = (leeway.reclaimable && w == live && m.windows > live) ||
                (ahead_ > 0 && w == ahead_target(m));  // perhaps after a reclaim
      count(w < m.windows ? "ahead windows reclaimed" : "ahead windows committed");
    }
    if (!allowed)
      fail(where + ": now has " + std::to_string(w) + " windows (" + seen.shape[s] + ")");
    m.windows = w;
  }
}

bool ModelRun::sampled(std::uint64_t token) const {
  const std::uint64_t in_window = token % per_window_;
  return in_window < 2 || in_window + 2 >= per_window_ || token % 37 == 0;
}

std::uint64_t ModelRun::tag(SlotId slot, std::uint64_t generation, std::uint64_t token,
                            std::uint64_t piece) const {
  return mix(seed_ ^ mix((std::uint64_t{slot} << 56) ^ (generation << 36) ^ (token << 8) ^ piece));
}

void ModelRun::write_tokens(SlotId slot, std::uint64_t from, std::uint64_t to) {
  const std::uint64_t generation = slots_[slot].generation;
  for_each_piece(slot, from, to,
                 [&](std::uint64_t t, std::uint64_t piece, Address head, Address tail) {
                   const std::uint64_t value = tag(slot, generation, t, piece);
                   const std::uint64_t inverse = ~value;
                   std::memcpy(reinterpret_cast<void*>(head), &value, sizeof value);
                   std::memcpy(reinterpret_cast<void*>(tail), &inverse, sizeof inverse);
                 });
}

void ModelRun::check_content() {
  for (SlotId s = 0; s < kSlots; ++s) {
    const ModelSlot& m = slots_[s];
    if (m.state != State::kActive) continue;
    for_each_piece(s, 0, m.tokens,
                   [&](std::uint64_t t, std::uint64_t piece, Address head, Address tail) {
                     std::uint64_t value = 0, inverse = 0;
                     std::memcpy(&value, reinterpret_cast<const void*>(head), sizeof value);
                     std::memcpy(&inverse, reinterpret_cast<const void*>(tail), sizeof inverse);
                     const std::uint64_t expected = tag(s, m.generation, t, piece);
                     if (value != expected || inverse != ~expected) {
                       fail("slot " + std::to_string(s) + " token " + std::to_string(t) +
                            " piece " + std::to_string(piece) + " reads " + std::to_string(value) +
                            "/" + std::to_string(~inverse) + ", wrote " + std::to_string(expected));
                     }
                   });
  }
}

void ModelRun::check_all() {
  const std::string problems = kt::check_invariants(world());
  if (!problems.empty()) fail("invariants:\n" + problems);
  const TierStats tier = governor_.stats(tier_);
  if (tier.used > tier.limit) fail("the tier uses more than its limit");
  const ArenaStats stats = arena_->stats();
  std::uint32_t active = 0, finished = 0, quarantined = 0;
  std::uint64_t committed = 0, live = 0, reclaimable = 0, active_committed = 0;
  for (SlotId s = 0; s < kSlots; ++s) {
    const ModelSlot& m = slots_[s];
    const std::string where = "slot " + std::to_string(s) + " (" + name(m.state) + ")";
    switch (m.state) {
      case State::kActive:
        ++active;
        live += m.tokens * plan_.bytes_per_token;
        active_committed += m.windows * window_bytes();
        if (m.windows < wpf(m.tokens)) {
          fail(where + ": " + std::to_string(m.windows) + " windows do not cover " +
               std::to_string(m.tokens) + " live tokens");
        }
        break;
      case State::kFinished:
        ++finished;
        reclaimable += m.windows * window_bytes();
        break;
      case State::kQuarantined:
        ++quarantined;
        break;
      case State::kFree:
        break;
    }
    if (m.state != State::kQuarantined) {
      committed += m.windows * window_bytes();
      if (arena_->tokens(s) != m.tokens) {
        fail(where + ": the arena says " + std::to_string(arena_->tokens(s)) + " tokens, the " +
             "model " + std::to_string(m.tokens));
      }
    }
    if (arena_->slot_base(s) != arena_->reservation().base() + s * plan_.slot_stride) {
      fail(where + ": its base moved");
    }
  }
  if (stats.active_slots != active || stats.finished_slots != finished ||
      stats.quarantined_slots != quarantined) {
    fail("stats count " + std::to_string(stats.active_slots) + " active, " +
         std::to_string(stats.finished_slots) + " finished, " +
         std::to_string(stats.quarantined_slots) + " quarantined slots; the model " +
         std::to_string(active) + ", " + std::to_string(finished) + ", " +
         std::to_string(quarantined));
  }
  if (stats.live_bytes != live) fail("stats live bytes " + std::to_string(stats.live_bytes));
  if (quarantined == 0) {
    const double waste =
        live == 0 ? 0.0 : static_cast<double>(active_committed - live) / static_cast<double>(live);
    if (std::abs(stats.waste_ratio - waste) > 1e-9 * (1 + waste)) {
      fail("waste ratio " + std::to_string(stats.waste_ratio) + ", the model " +
           std::to_string(waste));
    }
  }
  if (quarantined == 0) {
    const std::uint64_t mapped = arena_->reservation().mapped_bytes();
    if (stats.committed_bytes != mapped || committed != mapped) {
      fail("committed bytes " + std::to_string(stats.committed_bytes) + " (model " +
           std::to_string(committed) + ") differ from the reservation's mapped bytes " +
           std::to_string(mapped));
    }
    if (stats.reclaimable_bytes != reclaimable) {
      fail("reclaimable bytes " + std::to_string(stats.reclaimable_bytes) + ", the model " +
           std::to_string(reclaimable));
    }
  }
  if (stats.admissions != expected_.admissions ||
      stats.reused_admissions != expected_.reused_admissions ||
      stats.ensures != expected_.ensures ||
      stats.ensures_committing != expected_.ensures_committing ||
      stats.refusals != expected_.refusals) {
    fail("counters: admissions " + std::to_string(stats.admissions) + "/" +
         std::to_string(expected_.admissions) + ", reused " +
         std::to_string(stats.reused_admissions) + "/" +
         std::to_string(expected_.reused_admissions) + ", ensures " +
         std::to_string(stats.ensures) + "/" + std::to_string(expected_.ensures) + ", committing " +
         std::to_string(stats.ensures_committing) + "/" +
         std::to_string(expected_.ensures_committing) + ", refusals " +
         std::to_string(stats.refusals) + "/" + std::to_string(expected_.refusals) +
         " (arena/model)");
  }
  // New live tokens are written once the checks above said their windows are mapped
  // read-write; then every live token is read back.
  for (const auto& [slot, from, to] : writes_) {
    if (slots_[slot].state == State::kActive) write_tokens(slot, from, to);
  }
  writes_.clear();
  check_content();
}

}  // namespace kvvm::testing::arena_model
