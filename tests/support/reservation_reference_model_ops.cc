// The reference model of Reservation: the operations that change blocks (commit, release,
// set_access, map_shared), each predicting its result from the contract and the model.
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
#include "support/reservation_reference_model.h"

namespace kvvm::testing::reservation_model {

using kt::mix;

void ModelRun::commit(const OpSpec& op) {
  const std::size_t r = op.a % live_.size();
  ModelReservation& m = live_[r];
  Reservation& reservation = *m.reservation;
  std::vector<Range> ranges(1);
  std::size_t& offset = ranges[0].offset;
  std::size_t& len = ranges[0].len;
  const auto free_range = [&](std::size_t start, std::size_t most) {
    auto [first, run] = free_run(m, start % m.granules);
    return Range{first * g_,
                 (1 + op.e % std::max<std::size_t>(1, std::min<std::size_t>(run, most))) * g_};
  };
  switch (op.c % 20) {
    case 0:  // misaligned
      offset = (op.b % m.granules) * g_ + 8 * (1 + op.e % 8);
      len = (1 + op.e % 4) * g_;
      break;
    case 1:  // out of range
      offset = (m.granules - op.b % 2) * g_;
      len = (2 + op.e % 4) * g_;
      break;
    case 2:  // empty
      offset = (op.b % m.granules) * g_;
      len = 0;
      break;
    case 3:  // over something mapped, if anything is
      if (!m.blocks.empty()) {
        auto it = std::next(m.blocks.begin(), static_cast<std::ptrdiff_t>(op.b % m.blocks.size()));
        offset = it->first + (op.e % 2 == 0 ? 0 : it->second.bytes - g_);
        len = (1 + op.e % 3) * g_;
        break;
      }
      [[fallthrough]];
    case 4:  // two ranges of one transaction that overlap each other
      ranges[0] = free_range(op.b, 4);
      ranges.push_back(ranges[0]);
      break;
    case 5:
    case 6:
    case 7: {  // two free runs in one transaction (often they do not fit: then malformed)
      ranges[0] = free_range(op.b, 4);
      const std::size_t after = ranges[0].offset / g_ + ranges[0].len / g_ + (op.e >> 3) % 2;
      ranges.push_back(free_range(after, 3));
      break;
    }
    default:  // a free run (or, when there is none, something that overlaps)
      ranges[0] = free_range(op.b, 8);
      break;
  }
  std::size_t handle_bytes = (1 + op.d % 3) * g_;
  if (op.d % 16 == 15) handle_bytes = g_ + g_ / 2;  // not a multiple of the granule
  bool valid = handle_bytes % g_ == 0;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const Range& a = ranges[i];
    valid = valid && range_ok(m, a.offset, a.len) && free_in_model(m, a.offset, a.len);
    for (std::size_t k = 0; k < i; ++k) {
      const Range& b = ranges[k];
      valid = valid && !(a.offset < b.offset + b.len && b.offset < a.offset + a.len);
    }
    total += a.len;
  }
  const bool full_grant = (op.e >> 8) % 5 != 0 || total <= g_;
  const std::string what = std::string(ranges.size() > 1 ? "commit_ranges r" : "commit r") +
                           std::to_string(r) + " " + show_ranges(ranges) + " handles " +
                           std::to_string(handle_bytes) + (full_grant ? "" : " short grant") +
                           (valid ? "" : " (malformed)");
  note(what);

  // The grant: the whole range (one granule short, sometimes), or 0 when even that is
  // refused for a malformed call.
  const std::uint64_t wanted =
      valid ? (full_grant ? total : total - g_) : std::min<std::uint64_t>(total, 4 * g_);
  Result<Grant> grant = governor_.prepare(tier_, wanted);
  if (!grant.ok()) {
    if (grant.status().code() != StatusCode::kResourceExhausted ||
        !grant.status().exhaustion().has_value() ||
        grant.status().exhaustion()->requested != wanted) {
      fail(what + ": prepare: " + grant.status().to_string());
    }
    const TierStats tier = governor_.stats(tier_);
    if (tier.used + wanted <= tier.limit) {
      fail(what + ": prepare refused " + std::to_string(wanted) + " bytes with " +
           std::to_string(tier.limit - tier.used) + " available after reclaiming");
    }
    if (valid) {
      count("commit refused by the governor");
      return;
    }
    grant = governor_.prepare(tier_, 0);
    if (!grant.ok()) fail(what + ": prepare(0): " + grant.status().to_string());
  }

  const Snapshot before = snapshot();
  const std::uint64_t injected = fault_->injected();
  const std::uint64_t residual_before = reservation.residual_bytes();
  const CommitOptions options{Access::kReadWrite, handle_bytes};
  const Status status = ranges.size() == 1
                            ? reservation.commit(offset, len, &grant.value(), options)
                            : reservation.commit_ranges(ranges, &grant.value(), options);
  const bool faulted = fault_->injected() > injected;
  grant = Status::Unavailable("grant dropped");  // settles the grant
  const std::string result = what + ": " + status.to_string();

  if (!valid) {
    if (status.code() != StatusCode::kInvalidArgument) {
      fail(result + " (expected InvalidArgument)");
    }
    expect_unchanged(before, what);
    count("commit malformed");
    return;
  }
  if (status.ok()) {
    // The complete result: fresh private read-write handles tiling every range.
    for (const Range& range : ranges) {
      check_writable(reservation, range, result);
      for (std::size_t at = range.offset; at < range.offset + range.len;) {
        const Block* block = reservation.block_at(at);
        const std::size_t bytes = std::min(handle_bytes, range.offset + range.len - at);
        if (block == nullptr || block->offset != at || block->bytes != bytes ||
            block->handle_offset != 0 || block->access != Access::kReadWrite || block->shared ||
            block->poisoned) {
          fail(result + ": no fresh block of " + std::to_string(bytes) + " bytes at " +
               std::to_string(at) + (block ? ", found " + show(*block) : ""));
        }
        Result<HandleInfo> info = pool_->describe(block->handle);
        if (!info.ok() || info->state != HandleState::kInUse || info->mappings != 1 ||
            info->bytes != bytes || quarantined_.count(block->handle) != 0) {
          fail(result + ": handle of " + show(*block) + " is not a fresh in-use handle");
        }
        m.blocks[at] = ModelBlock{bytes, block->handle, 0, Access::kReadWrite, false, false};
        handle_bytes_[block->handle] = bytes;
        write_tags(reservation, at, *block);
        at += bytes;
      }
    }
    count(ranges.size() > 1 ? "commit_ranges ok" : "commit ok");
    return;
  }
  if (is_refusal(status)) fail(result + " (a well-formed commit was refused)");
  const bool exhausted = status.code() == StatusCode::kResourceExhausted;
  if (exhausted) {
    if (full_grant) fail(result + " (the grant covered the whole range)");
  } else if (status.code() != StatusCode::kDriverError || !faulted) {
    fail(result + (faulted ? "" : " (no fault was injected)"));
  }
  // The grant rolled back: no handle stays checked out and no healthy memory is left
  // behind (handles the commit created are released again; only quarantined bytes, of
  // poisoned blocks or failed releases, may remain).
  const PoolSnapshot pool = pool_->snapshot();
  if (pool.handles_in_use != before.pool.handles_in_use ||
      pool.mapped_bytes + pool.pooled_bytes > before.pool.mapped_bytes + before.pool.pooled_bytes) {
    fail(result + ": the rolled-back commit left memory behind (in use " +
         std::to_string(before.pool.mapped_bytes) + " -> " + std::to_string(pool.mapped_bytes) +
         ", pooled " + std::to_string(before.pool.pooled_bytes) + " -> " +
         std::to_string(pool.pooled_bytes) + ")");
  }
  // Nothing new but poisoned residual, which must be reported.
  const std::size_t poisoned = learn_residual(m, reservation, ranges, result);
  if ((poisoned > 0) != (status.message().find("poisoned") != std::string::npos) ||
      reservation.residual_bytes() < residual_before) {
    fail(result + ": residual " + std::to_string(poisoned) + " block(s) not reported exactly");
  }
  count(poisoned > 0 ? "commit failed with residual"
        : exhausted  ? "commit rolled back (grant short)"
                     : "commit rolled back (driver fault)");
}

std::size_t ModelRun::learn_residual(ModelReservation& m, const Reservation& reservation,
                                     const std::vector<Range>& ranges, const std::string& result) {
  std::size_t added = 0;
  for (const Block& block : reservation.blocks()) {
    if (m.blocks.count(block.offset) != 0) continue;
    const bool in_ranges = std::any_of(ranges.begin(), ranges.end(), [&](const Range& range) {
      return block.offset >= range.offset && block.offset + block.bytes <= range.offset + range.len;
    });
    if (!block.poisoned || !in_ranges) {
      fail(result + ": left an unexpected block " + show(block));
    }
    Result<HandleInfo> info = pool_->describe(block.handle);
    if (!info.ok() || info->state != HandleState::kQuarantined) {
      fail(result + ": the handle of poisoned " + show(block) + " is not quarantined");
    }
    m.blocks[block.offset] = ModelBlock{block.bytes,  block.handle, block.handle_offset,
                                        block.access, block.shared, true};
    quarantined_.insert(block.handle);
    ++added;
  }
  return added;
}

std::pair<std::size_t, std::size_t> ModelRun::pick_range(const ModelReservation& m,
                                                         const OpSpec& op) {
  if (op.b % 10 < 2 || m.blocks.empty()) {
    std::size_t offset = (op.c % (m.granules + 1)) * g_;
    if (op.d % 7 == 0) offset += g_ / 2;
    return {offset, (1 + op.e % 6) * g_};
  }
  auto it = std::next(m.blocks.begin(), static_cast<std::ptrdiff_t>(op.c % m.blocks.size()));
  const std::size_t offset = it->first;
  std::size_t end = it->first + it->second.bytes;
  for (std::uint32_t more = op.e % 3; more > 0; --more) {
    auto next = m.blocks.find(end);
    if (next == m.blocks.end()) break;
    end += next->second.bytes;
  }
  return {offset, end - offset};
}

void ModelRun::release(const OpSpec& op) {
  const std::size_t r = op.a % live_.size();
  ModelReservation& m = live_[r];
  Reservation& reservation = *m.reservation;
  const auto [offset, len] = pick_range(m, op);
  const Coverage cover = coverage(m, offset, len);
  const std::string what = "release r" + std::to_string(r) + " [" + std::to_string(offset) + ", +" +
                           std::to_string(len) + ")";
  note(what);
  const Snapshot before = snapshot();
  const std::uint64_t injected = fault_->injected();
  const Status status = reservation.release(offset, len);
  const bool faulted = fault_->injected() > injected;
  const std::string result = what + ": " + status.to_string();

  if (cover != Coverage::kCovered) {
    if (!is_refusal(status) ||
        (cover == Coverage::kPoisoned && status.code() != StatusCode::kFailedPrecondition)) {
      fail(result + (cover == Coverage::kPoisoned ? " (expected FailedPrecondition)"
                                                  : " (expected a refusal)"));
    }
    expect_unchanged(before, what);
    count("release malformed");
    return;
  }
  if (status.ok()) {
    m.blocks.erase(m.blocks.lower_bound(offset), m.blocks.lower_bound(offset + len));
    count("release ok");
    return;
  }
  if (status.code() != StatusCode::kDriverError || !faulted ||
      status.message().find("poisoned") == std::string::npos) {
    fail(result +
         " (a failed release must be an injected driver error reported as "
         "poisoned)");
  }
  // Each block of the range is gone, or still there, poisoned, with its handle quarantined.
  std::size_t poisoned = 0;
  for (auto it = m.blocks.lower_bound(offset); it != m.blocks.lower_bound(offset + len);) {
    const Block* block = reservation.block_at(it->first);
    if (block == nullptr) {
      it = m.blocks.erase(it);
      continue;
    }
    ModelBlock expected = it->second;
    expected.poisoned = true;
    Result<HandleInfo> info = pool_->describe(block->handle);
    if (!same(*block, it->first, expected) || !info.ok() ||
        info->state != HandleState::kQuarantined) {
      fail(result + ": left " + show(*block) + " where the model had " +
           show(it->first, it->second));
    }
    it->second.poisoned = true;
    quarantined_.insert(block->handle);
    ++poisoned;
    ++it;
  }
  if (poisoned == 0) fail(result + ": failed, yet nothing was left behind");
  count("release failed with residual");
}

void ModelRun::set_access(const OpSpec& op) {
  const std::size_t r = op.a % live_.size();
  ModelReservation& m = live_[r];
  Reservation& reservation = *m.reservation;
  const auto [offset, len] = pick_range(m, op);
  constexpr std::array kAccess = {Access::kReadOnly, Access::kReadWrite, Access::kNone};
  const Access access = kAccess[op.d % kAccess.size()];
  const Coverage cover = coverage(m, offset, len);
  const std::string what = "set_access r" + std::to_string(r) + " [" + std::to_string(offset) +
                           ", +" + std::to_string(len) + ") " + std::string(to_string(access));
  note(what);
  const Snapshot before = snapshot();
  const std::uint64_t injected = fault_->injected();
  const Status status = reservation.set_access(offset, len, access);
  const bool faulted = fault_->injected() > injected;
  const std::string result = what + ": " + status.to_string();

  if (cover != Coverage::kCovered) {
    if (!is_refusal(status) ||
        (cover == Coverage::kPoisoned && status.code() != StatusCode::kFailedPrecondition)) {
      fail(result + " (expected a refusal)");
    }
    expect_unchanged(before, what);
    count("set_access malformed");
    return;
  }
  if (status.ok()) {
    for (auto it = m.blocks.lower_bound(offset); it != m.blocks.lower_bound(offset + len); ++it) {
      it->second.access = access;
    }
    count("set_access ok");
    return;
  }
  if (status.code() != StatusCode::kDriverError || !faulted) fail(result);
  count("set_access failed");  // the model stays as it was; check_all verifies the maps
}

void ModelRun::map_shared(const OpSpec& op) {
  const std::size_t dst = op.a % live_.size();
  // The source: another live reservation with a healthy block.
  std::optional<std::size_t> src;
  for (std::size_t step = 1; step < live_.size() && !src; ++step) {
    const std::size_t r = (dst + op.b % live_.size() + step) % live_.size();
    if (r == dst) continue;
    for (const auto& [at, block] : live_[r].blocks) {
      if (!block.poisoned) {
        src = r;
        break;
      }
    }
  }
  if (!src) {
    // Nothing to share from: make another reservation instead, when there is room.
    if (live_.size() < kMaxReservations) return create(op);
    note("map_shared r" + std::to_string(dst) + ": no source");
    count("map_shared skipped (no source)");
    return;
  }
  std::vector<std::pair<std::size_t, ModelBlock>> healthy;
  for (const auto& [at, block] : live_[*src].blocks) {
    if (!block.poisoned) healthy.emplace_back(at, block);
  }
  const ModelBlock& source = healthy[op.c % healthy.size()].second;
  const Handle handle = source.handle;
  const std::size_t handle_bytes = handle_bytes_.at(handle);
  const std::size_t handle_granules = handle_bytes / g_;

  ModelReservation& m = live_[dst];
  Reservation& reservation = *m.reservation;
  std::size_t handle_offset = (op.e % handle_granules) * g_;
  std::size_t bytes =
      (op.e >> 4) % 2 == 0 ? 0 : (1 + (op.e >> 5) % (handle_granules - handle_offset / g_)) * g_;
  const std::size_t mapped_bytes = bytes != 0 ? bytes : handle_bytes - handle_offset;
  auto [first, run] = free_run(m, op.d % m.granules);
  std::size_t offset = first * g_;  // may not be long enough: then it overlaps
  Result<HandleInfo> described = pool_->describe(handle);
  if (!described.ok())
    fail("map_shared: the pool does not know in-use handle " + std::to_string(handle));
  HandleInfo info = *described;
  std::string mode;
  switch (op.d % 20) {
    case 0:
      info.handle = handle + 1000003;  // unknown to the pool
      mode = " unknown handle";
      break;
    case 1:
      info.bytes += g_;  // does not match what the pool knows
      mode = " wrong handle size";
      break;
    case 2:
      handle_offset = handle_bytes + (op.e % 2) * g_;  // beyond the handle
      mode = " handle range beyond its end";
      break;
    case 3:
      offset = (op.c % m.granules) * g_ + g_ / 2;  // misaligned
      mode = " misaligned";
      break;
    case 4:
      offset = m.granules * g_ - g_ * (op.c % 2);  // out of range, unless it just fits
      mode = " at the end";
      break;
    default:
      break;
  }
  const std::size_t range =
      bytes != 0 ? bytes : (handle_offset < handle_bytes ? handle_bytes - handle_offset : 0);
  const bool valid = info.handle == handle && info.bytes == handle_bytes &&
                     quarantined_.count(handle) == 0 && handle_offset % g_ == 0 && range > 0 &&
                     handle_offset + range <= handle_bytes && range_ok(m, offset, range) &&
                     free_in_model(m, offset, range);
  const std::string what = "map_shared r" + std::to_string(dst) + " at " + std::to_string(offset) +
                           " <- h" + std::to_string(handle) + "+" + std::to_string(handle_offset) +
                           " " + std::to_string(bytes) + " bytes of r" + std::to_string(*src) +
                           mode + (valid ? "" : " (malformed)");
  note(what);
  const Snapshot before = snapshot();
  const std::uint64_t injected = fault_->injected();
  const Status status =
      reservation.map_shared(offset, info, Access::kReadOnly, handle_offset, bytes);
  const bool faulted = fault_->injected() > injected;
  const std::string result = what + ": " + status.to_string();

  if (!valid) {
    if (status.code() != StatusCode::kInvalidArgument) {
      fail(result + " (expected InvalidArgument)");
    }
    expect_unchanged(before, what);
    count("map_shared malformed");
    return;
  }
  if (status.ok()) {
    const Block* block = reservation.block_at(offset);
    const ModelBlock expected{mapped_bytes, handle, handle_offset, Access::kReadOnly, true, false};
    if (block == nullptr || !same(*block, offset, expected)) {
      fail(result + ": expected " + show(offset, expected) +
           (block ? ", found " + show(*block) : ", found nothing"));
    }
    m.blocks[offset] = expected;
    count("map_shared ok");
    return;
  }
  if (status.code() != StatusCode::kDriverError || !faulted) fail(result);
  const std::size_t poisoned = learn_residual(m, reservation, {Range{offset, range}}, result);
  if ((poisoned > 0) != (status.message().find("poisoned") != std::string::npos)) {
    fail(result + ": residual not reported exactly");
  }
  count(poisoned > 0 ? "map_shared failed with residual" : "map_shared withdrawn");
}

}  // namespace kvvm::testing::reservation_model
