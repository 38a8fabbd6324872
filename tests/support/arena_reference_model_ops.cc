// The reference model of Arena: the operations (admit, ensure, finish, release, reclaim and
// capture spans), each predicting its result from the contract and the model.
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
#include "support/arena_reference_model.h"
#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm::testing::arena_model {

using kt::mix;

void ModelRun::op_begin(std::uint64_t seed) {
  if (guard_ && capture_ops_left_ == 0) {
    note("end capture");
    guard_.reset();
    count("capture ended");
    settle(seed ^ 0xe4d);
    reconcile();
  }
}

void ModelRun::apply(const OpSpec& op) {
  const bool captured = guard_.has_value();
  const std::uint64_t calls_before = memory_calls();
  if (op.kind < 18) {
    admit(op);
  } else if (op.kind < 58) {
    ensure(op, false);
  } else if (op.kind < 72) {
    finish(op);
  } else if (op.kind < 86) {
    reclaim(op);
  } else if (op.kind < 92) {
    if (guard_) {
      ensure(op, true);
    } else {
      note("begin capture");
      guard_.emplace(arena_->begin_capture());
      capture_ops_left_ = 1 + op.a % 4;
      count("capture begun");
    }
  } else {
    ensure(op, true);
  }
  if (captured) {
    if (ahead_ > 0) std::this_thread::yield();  // give a misbehaving worker its chance
    if (memory_calls() != calls_before) {
      fail("a map, unmap, set_access, create or release call happened during capture");
    }
    --capture_ops_left_;
  }
  if (!guard_) settle(op.fault_seed);
  reconcile(leeway_);
  leeway_ = {};
  if (failed_target_) {
    const bool poisoned = slots_[*failed_target_].state == State::kQuarantined;
    if (poisoned != failed_said_poisoned_) {
      fail("slot " + std::to_string(*failed_target_) +
           (poisoned ? " was quarantined, yet the error does not say poisoned"
                     : " says poisoned, yet it was not quarantined"));
    }
    failed_target_.reset();
  }
  if (post_) {
    post_();
    post_ = nullptr;
  }
}

std::uint64_t ModelRun::pick_tokens(std::uint32_t x, std::uint32_t y) const {
  const std::uint64_t max = plan_.max_context;
  switch (x % 8) {
    case 0:
      return 0;
    case 1:
    case 2:
      return 1 + y % (per_window_ + 1);  // short
    case 3: {
      const std::uint64_t boundary = (1 + y % max_windows_) * per_window_;  // at a boundary
      return std::min(max, boundary + (y >> 8) % 3 - 1);
    }
    default:
      return y % (max + 1);
  }
}

std::optional<SlotId> ModelRun::predict_admit(std::uint64_t needed) const {
  std::optional<SlotId> chosen;
  for (SlotId id = 0; id < kSlots; ++id) {
    if (slots_[id].state != State::kFinished) continue;
    if (!chosen) {
      chosen = id;
      continue;
    }
    const std::uint64_t have = slots_[id].windows, best = slots_[*chosen].windows;
    const bool covers = have >= needed, best_covers = best >= needed;
    if ((covers && (!best_covers || have < best)) || (!covers && !best_covers && have > best)) {
      chosen = id;
    }
  }
  for (SlotId id = 0; id < kSlots && !chosen; ++id) {
    if (slots_[id].state == State::kFree) chosen = id;
  }
  return chosen;
}

void ModelRun::commit_failed(const Status& status, std::size_t slot, std::uint64_t request,
                             bool feasible, bool faulted, const std::string& result) {
  if (status.code() == StatusCode::kResourceExhausted) {
    if (feasible && !faulted) {
      fail(result + ": refused, yet the tier could pay " + std::to_string(request) +
           " bytes after reclaiming");
    }
    if (!status.exhaustion() || status.exhaustion()->requested != request) {
      fail(result + ": the refusal does not carry requested = " + std::to_string(request));
    }
  } else if (status.code() != StatusCode::kDriverError || !faulted) {
    fail(result + " (a failed commit must be ResourceExhausted or an injected DriverError)");
  }
  if (!feasible && status.code() != StatusCode::kResourceExhausted) {
    fail(result + ": beyond the budget, expected ResourceExhausted");
  }
  leeway_.target = slot;
  failed_target_ = slot;
  failed_said_poisoned_ = status.message().find("poisoned") != std::string::npos;
}

void ModelRun::admit(const OpSpec& op) {
  const std::uint64_t max = plan_.max_context;
  const std::uint64_t tokens = op.b % 16 == 0 ? max + 1 + op.c % 8 : pick_tokens(op.a, op.c);
  const std::uint64_t needed = tokens <= max ? wpf(tokens) : 0;
  const std::string what = "admit " + std::to_string(tokens);
  note(what);
  const std::uint64_t calls = fault_->counts().total();
  const std::uint64_t injected = fault_->injected();
  const std::optional<SlotId> predicted = predict_admit(needed);
  const std::uint64_t have = predicted ? slots_[*predicted].windows : 0;
  const std::uint64_t request = have < needed ? (needed - have) * window_bytes() : 0;
  const bool feasible = predicted && request <= headroom(*predicted);
  Result<SlotId> got = arena_->admit(tokens);
  const bool faulted = fault_->injected() > injected;
  const std::string result =
      what + ": " + (got.ok() ? "slot " + std::to_string(*got) : got.status().to_string());
  note("  -> " + result);

  if (tokens > max) {
    expect_code(got.status(), StatusCode::kInvalidArgument, result);
    expect_no_driver_call(calls, result);
    count("admit beyond max context");
    return;
  }
  if (guard_) {
    expect_code(got.status(), StatusCode::kUnavailable, result);
    expect_no_driver_call(calls, result);
    count("admit refused during capture");
    return;
  }
  if (!predicted) {
    expect_code(got.status(), StatusCode::kUnavailable, result);
    expect_no_driver_call(calls, result);
    count("admit with every slot taken");
    return;
  }
  if (got.ok()) {
    if (*got != *predicted) fail(result + ", expected slot " + std::to_string(*predicted));
    if (!feasible) fail(result + ": admitted beyond the budget");
    ModelSlot& m = slots_[*got];
    const bool reused = m.state == State::kFinished;
    m.state = State::kActive;
    m.tokens = tokens;
    m.windows = std::max(have, needed);
    ++m.generation;
    m.last_used = ++tick_;
    ++expected_.admissions;
    if (reused) ++expected_.reused_admissions;
    leeway_.reclaimable = request > 0;
    writes_.push_back({*got, 0, tokens});
    count(reused ? (request > 0 ? "admit reused + commit" : "admit reused") : "admit ok");
    return;
  }
  if (request == 0) fail(result + ": failed, yet it needed no commit");
  commit_failed(got.status(), *predicted, request, feasible, faulted, result);
  if (got.status().code() == StatusCode::kResourceExhausted) ++expected_.refusals;
  leeway_.reclaimable = true;
  count(got.status().code() == StatusCode::kResourceExhausted ? "admit refused (budget)"
                                                              : "admit failed (fault)");
}

void ModelRun::ensure(const OpSpec& op, bool decode_step) {
  std::vector<SlotId> active, inactive;
  for (SlotId id = 0; id < kSlots; ++id) {
    (slots_[id].state == State::kActive ? active : inactive).push_back(id);
  }
  const std::uint64_t max = plan_.max_context;
  SlotId slot = 0;
  std::uint64_t tokens = 0;
  const std::uint32_t mode = op.b % 16;
  if (active.empty() && mode != 0) {
    admit(op);  // nothing to grow yet
    return;
  }
  if (mode == 0) {  // no sequence there, or an unknown slot
    slot = inactive.empty() || op.a % 8 == 0 ? kSlots + op.a % 3 : inactive[op.a % inactive.size()];
    tokens = pick_tokens(op.c, op.a);
  } else {
    slot = active[op.a % active.size()];
    const std::uint64_t now = slots_[slot].tokens;
    if (mode == 1) {
      tokens = max + 1 + op.c % 4;  // beyond the max context
    } else if (decode_step) {
      tokens = std::min(max, now + 1 + op.c % 3);
    } else if (mode < 5) {
      tokens = now == 0 ? 0 : op.c % (now + 1);  // shrink (or stay)
    } else if (mode < 11) {
      tokens = std::min(max, now + 1 + op.c % (per_window_ + 1));
    } else {
      tokens = pick_tokens(op.c, op.a);
    }
  }
  const std::string what = "ensure slot " + std::to_string(slot) + " to " + std::to_string(tokens) +
                           (decode_step ? " (decode)" : "");
  note(what);
  const std::uint64_t calls = fault_->counts().total();
  const std::uint64_t injected = fault_->injected();
  const bool known = slot < kSlots;
  const std::uint64_t needed = tokens <= max ? wpf(tokens) : 0;
  const std::uint64_t have = known ? slots_[slot].windows : 0;
  const std::uint64_t request = have < needed ? (needed - have) * window_bytes() : 0;
  const bool feasible = known && request <= headroom(slot);
  const Status status = arena_->ensure(slot, tokens);
  const bool faulted = fault_->injected() > injected;
  const std::string result = what + ": " + status.to_string();
  note("  -> " + result);

  if (!known || tokens > max) {
    expect_code(status, StatusCode::kInvalidArgument, result);
    expect_no_driver_call(calls, result);
    count(known ? "ensure beyond max context" : "ensure of an unknown slot");
    return;
  }
  ModelSlot& m = slots_[slot];
  if (m.state != State::kActive) {
    expect_code(status, StatusCode::kFailedPrecondition, result);
    expect_no_driver_call(calls, result);
    count("ensure without a sequence");
    return;
  }
  ++expected_.ensures;
  const std::uint64_t before = m.tokens;
  if (needed <= m.windows) {
    if (!status.ok()) fail(result + ": its windows were mapped already");
    m.tokens = tokens;
    m.last_used = ++tick_;
    if (tokens > before) writes_.push_back({slot, before, tokens});
    count(tokens < before ? "ensure shrink" : "ensure within mapped windows");
    return;
  }
  if (guard_) {
    expect_code(status, StatusCode::kUnavailable, result);
    if (status.message().find("during graph capture") == std::string::npos) {
      fail(result + ": the refusal does not name the capture");
    }
    expect_no_driver_call(calls, result);
    count("ensure refused during capture");
    return;
  }
  ++expected_.ensures_committing;
  leeway_.reclaimable = true;
  if (status.ok()) {
    if (!feasible) fail(result + ": committed beyond the budget");
    m.windows = needed;
    m.tokens = tokens;
    m.last_used = ++tick_;
    writes_.push_back({slot, before, tokens});
    count("ensure commit");
    return;
  }
  commit_failed(status, slot, request, feasible, faulted, result);
  if (status.code() == StatusCode::kResourceExhausted) ++expected_.refusals;
  count(status.code() == StatusCode::kResourceExhausted ? "ensure refused (budget)"
                                                        : "ensure failed (fault)");
}

void ModelRun::finish(const OpSpec& op) {
  std::vector<SlotId> active, inactive;
  for (SlotId id = 0; id < kSlots; ++id) {
    (slots_[id].state == State::kActive ? active : inactive).push_back(id);
  }
  if (active.empty() && op.b % 8 != 0) {
    admit(op);  // nothing to finish yet
    return;
  }
  SlotId slot = 0;
  if (op.b % 8 == 0) {
    slot = inactive.empty() || op.a % 8 == 0 ? kSlots + op.a % 3 : inactive[op.a % inactive.size()];
  } else {
    slot = active[op.a % active.size()];
  }
  // release() is finish() and an immediate unmap of the slot (its fence is complete at once
  // on the host).
  const bool release = op.c % 3 == 0;
  const std::string what = (release ? "release slot " : "finish slot ") + std::to_string(slot);
  note(what);
  const std::uint64_t calls = fault_->counts().total();
  const std::uint64_t injected = fault_->injected();
  const Status status = release ? arena_->release(slot) : arena_->finish(slot);
  const bool faulted = fault_->injected() > injected;
  const std::string result = what + ": " + status.to_string();
  note("  -> " + result);
  if (slot >= kSlots) {
    expect_code(status, StatusCode::kInvalidArgument, result);
    expect_no_driver_call(calls, result);
    count("finish of an unknown slot");
    return;
  }
  ModelSlot& m = slots_[slot];
  if (m.state != State::kActive) {
    expect_code(status, StatusCode::kFailedPrecondition, result);
    expect_no_driver_call(calls, result);
    count("finish without a sequence");
    return;
  }
  if (guard_ && !status.ok()) {  // finish maps nothing: refusing it during capture is allowed
    expect_code(status, StatusCode::kUnavailable, result);
    expect_no_driver_call(calls, result);
    count("finish refused during capture");
    return;
  }
  if (!status.ok()) {
    if (status.code() != StatusCode::kDriverError || !faulted) fail(result);
    count("finish failed (fence fault)");
    return;
  }
  m.state = State::kFinished;
  m.tokens = 0;
  m.last_used = ++tick_;
  if (!release) {
    count("finish ok");
    return;
  }
  leeway_.released = slot;
  const bool mapped = m.windows > 0;
  post_ = [this, slot, mapped, faulted, result] {
    const State state = slots_[slot].state;
    if (!faulted && mapped && state != State::kFree) {
      fail(result + ": the slot is " + name(state) + ", not free with its windows unmapped");
    }
    count(state == State::kFree ? "release ok (unmapped)" : "release ok (kept)");
  };
}

void ModelRun::reclaim(const OpSpec& op) {
  std::uint64_t bytes = 0;
  switch (op.c % 6) {
    case 0:
      bytes = 0;
      break;
    case 1:
      bytes = 1;
      break;
    case 2:
    case 3:
      bytes = (1 + op.a % 8) * g_;
      break;
    case 4:
      bytes = (op.a % 20) * window_bytes();
      break;
    default:
      bytes = UINT64_MAX;
      break;
  }
  const std::string what = "reclaim " + std::to_string(bytes);
  note(what);
  // The candidates in the order the contract gives: finished slots least recently used
  // first, then windows beyond active live lengths, least recently used first.
  std::vector<std::size_t> order;
  for (const State state : {State::kFinished, State::kActive}) {
    std::vector<std::size_t> group;
    for (std::size_t s = 0; s < kSlots; ++s) {
      const ModelSlot& m = slots_[s];
      if (m.state != state) continue;
      if (state == State::kFinished ? m.windows > 0 : m.windows > wpf(m.tokens)) {
        group.push_back(s);
      }
    }
    std::sort(group.begin(), group.end(), [&](std::size_t x, std::size_t y) {
      return slots_[x].last_used < slots_[y].last_used;
    });
    order.insert(order.end(), group.begin(), group.end());
  }
  const std::vector<ModelSlot> before = slots_;
  const std::uint64_t calls = fault_->counts().total();
  const std::uint64_t injected = fault_->injected();
  const std::uint64_t used_before = governor_.stats(tier_).used;
  const std::uint64_t returned = arena_->reclaim(bytes);
  const bool faulted = fault_->injected() > injected;
  const std::uint64_t used_after = governor_.stats(tier_).used;
  const std::string result = what + ": returned " + std::to_string(returned);
  note("  -> " + result);
  if (guard_) {
    if (returned != 0) fail(result + " during capture");
    expect_no_driver_call(calls, result);
    count("reclaim during capture");
    return;
  }
  leeway_.reclaimable = true;
  if (ahead_ > 0) {  // the worker commits again meanwhile: only the model's leeway applies
    count("reclaim (commit-ahead)");
    return;
  }
  if (used_after > used_before || returned > used_before - used_after) {
    fail(result + ", yet the tier went from " + std::to_string(used_before) + " to " +
         std::to_string(used_after) + " bytes used");
  }
  if (returned != used_before - used_after) {
    fail(result + ", yet the tier got back " + std::to_string(used_before - used_after));
  }
  // Which candidates it touched, checked once reconcile() learned the new state.
  post_ = [this, before, order, bytes, returned, faulted, result] {
    std::vector<std::size_t> touched;
    std::uint64_t unmapped = 0;
    for (std::size_t s : order) {
      const ModelSlot& was = before[s];
      const ModelSlot& now = slots_[s];
      if (now.state == was.state && now.windows == was.windows) continue;
      touched.push_back(s);
    }
    count(touched.empty() ? "reclaim (nothing)" : "reclaim");
    if (faulted) return;  // a fence or release fault may skip a candidate or keep its bytes
    for (std::size_t i = 0; i < touched.size(); ++i) {
      if (touched[i] != order[i]) {
        fail(result + ": reclaimed slot " + std::to_string(touched[i]) +
             " out of order (expected slot " + std::to_string(order[i]) + " next)");
      }
    }
    if (bytes == 0 && !touched.empty()) fail(result + ": reclaimed for 0 bytes");
    if (bytes > 0 && !order.empty() && touched.empty()) fail(result + ": reclaimed nothing");
    if (touched.size() < order.size() && returned < bytes) {
      fail(result + ": stopped before giving back " + std::to_string(bytes) + " bytes");
    }
    for (std::size_t i = 0; i + 1 < touched.size(); ++i) {
      const ModelSlot& was = before[touched[i]];
      unmapped +=
          (was.windows - (was.state == State::kActive ? wpf(was.tokens) : 0)) * window_bytes();
    }
    if (unmapped >= bytes && !touched.empty()) {
      fail(result + ": went on unmapping after " + std::to_string(unmapped) +
           " bytes, which were enough");
    }
  };
}

}  // namespace kvvm::testing::arena_model
