// The governor's ledger: per tier, used + reserved <= limit at every moment.
//
// Why a ticket queue rather than "whoever wakes first wins": a large request (a long prompt
// being admitted) would otherwise starve behind a stream of small ones, because every time a
// little memory comes back a small request fits first. So once anyone is waiting in a tier,
// every later prepare() queues behind it and only the head of the queue may be granted, even
// when a later request would fit. The head is also the only caller that runs the tier's
// reclaimers, which makes "one reclaim pass per tier at a time" a consequence of the queue
// rather than a second protocol.
//
// Lock order: Governor::mutex_ is a leaf lock. Nothing else is acquired while it is held and
// no caller code (reclaimers) runs under it, so any component may call the governor while
// holding its own locks. Reclaimers therefore run without mutex_: they give memory back
// through return_bytes(), which takes it, and they take their own locks (the handle pool's).
// The one wait that is not for bytes, Registration's destructor waiting for a run of its
// reclaimer on another thread to end, is why a token must not be destroyed under a lock
// that reclaimer takes.
#include "kvvm/governor/governor.h"

#include <algorithm>
#include <string>
#include <utility>

#include "kvvm/base/log.h"

namespace kvvm {
namespace {

// A wait longer than this is treated as this: it keeps deadline arithmetic from overflowing
// when a caller passes milliseconds::max() to mean "as long as it takes".
constexpr std::chrono::milliseconds kMaxWait = std::chrono::hours(24 * 365);

std::uint64_t available(const TierStats& s) { return s.limit - s.used - s.reserved; }

bool fits(const TierStats& s, std::uint64_t bytes) { return bytes <= available(s); }

void note_peak(TierStats& s) { s.peak = std::max(s.peak, s.used + s.reserved); }

// "tier 'gpu0': requested 4194304 bytes, available 2097152 of limit 8388608 (used 6291456,
// reserved 0)": every refusal starts this way so an operator sees the whole ledger.
std::string refusal_text(const TierStats& s, std::uint64_t requested) {
  return "tier '" + s.name + "': requested " + std::to_string(requested) + " bytes, available " +
         std::to_string(available(s)) + " of limit " + std::to_string(s.limit) + " (used " +
         std::to_string(s.used) + ", reserved " + std::to_string(s.reserved) + ")";
}

Status refusal(const TierStats& s, std::uint64_t requested, const std::string& why) {
  return Status::ResourceExhausted(refusal_text(s, requested) + why,
                                   Exhaustion{requested, available(s), s.limit});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Grant

Grant::Grant(Grant&& other) noexcept
    : governor_(std::exchange(other.governor_, nullptr)),
      tier_(std::exchange(other.tier_, 0)),
      prepared_(std::exchange(other.prepared_, 0)),
      charged_(std::exchange(other.charged_, 0)) {}

Grant& Grant::operator=(Grant&& other) noexcept {
  if (this != &other) {
    commit_charged();  // the grant being overwritten settles like a dropped one
    governor_ = std::exchange(other.governor_, nullptr);
    tier_ = std::exchange(other.tier_, 0);
    prepared_ = std::exchange(other.prepared_, 0);
    charged_ = std::exchange(other.charged_, 0);
  }
  return *this;
}

Grant::~Grant() { commit_charged(); }

Status Grant::charge(std::uint64_t bytes) {
  if (!active()) {
    return Status::FailedPrecondition("charge(" + std::to_string(bytes) +
                                      ") on a grant that is not active");
  }
  if (bytes > remaining()) {
    return Status::ResourceExhausted(
        "grant in tier " + std::to_string(tier_) + ": charge of " + std::to_string(bytes) +
            " bytes exceeds the " + std::to_string(remaining()) + " bytes remaining of " +
            std::to_string(prepared_) + " prepared (" + std::to_string(charged_) + " charged)",
        Exhaustion{bytes, remaining(), prepared_});
  }
  KVVM_RETURN_IF_ERROR(governor_->charge(tier_, bytes));
  charged_ += bytes;
  return Status::Ok();
}

Status Grant::commit(std::uint64_t actual) {
  if (!active()) {
    return Status::FailedPrecondition("commit(" + std::to_string(actual) +
                                      ") on a grant that is not active");
  }
  if (actual < charged_ || actual > prepared_) {
    return Status::InvalidArgument("commit(" + std::to_string(actual) + ") on a grant in tier " +
                                   std::to_string(tier_) + " needs charged " +
                                   std::to_string(charged_) + " <= actual <= prepared " +
                                   std::to_string(prepared_));
  }
  settle(actual);
  return Status::Ok();
}

void Grant::commit_charged() {
  if (active()) settle(charged_);
}

void Grant::settle(std::uint64_t actual) {
  governor_->settle(tier_, prepared_, charged_, actual);
  governor_ = nullptr;
  charged_ = actual;  // kept (with prepared_) so a settled grant still says what it was
}

// ---------------------------------------------------------------------------------------------
// Registration

Governor::Registration::Registration(Registration&& other) noexcept
    : governor_(std::exchange(other.governor_, nullptr)), id_(std::exchange(other.id_, 0)) {}

Governor::Registration& Governor::Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    if (governor_ != nullptr) governor_->remove_reclaimer(id_);
    governor_ = std::exchange(other.governor_, nullptr);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

Governor::Registration::~Registration() {
  if (governor_ != nullptr) governor_->remove_reclaimer(id_);
}

// ---------------------------------------------------------------------------------------------
// Governor

TierId Governor::add_tier(std::string name, std::uint64_t limit) {
  MutexLock lock(mutex_);
  Tier tier;
  tier.stats.name = std::move(name);
  tier.stats.limit = limit;
  tiers_.push_back(std::move(tier));
  return tiers_.size() - 1;
}

std::size_t Governor::tier_count() const {
  MutexLock lock(mutex_);
  return tiers_.size();
}

Status Governor::check_tier(TierId tier) const {
  if (tier < tiers_.size()) return Status::Ok();
  return Status::InvalidArgument("unknown tier " + std::to_string(tier) + ": the governor has " +
                                 std::to_string(tiers_.size()) + " tiers");
}

TierStats Governor::stats(TierId tier) const {
  MutexLock lock(mutex_);
  if (Status s = check_tier(tier); !s.ok()) {
    lock.unlock();
    log(LogLevel::kWarning, "governor: stats(): " + s.message());
    return TierStats{};
  }
  TierStats s = tiers_[tier].stats;
  s.waiting = tiers_[tier].queue.size();
  return s;
}

Result<Grant> Governor::prepare(TierId tier, std::uint64_t bytes, std::chrono::milliseconds wait) {
  wait = std::clamp(wait, std::chrono::milliseconds(0), kMaxWait);
  const auto deadline = std::chrono::steady_clock::now() + wait;

  MutexLock lock(mutex_);
  KVVM_RETURN_IF_ERROR(check_tier(tier));
  {
    TierStats& s = tiers_[tier].stats;
    if (bytes == 0) {
      ++s.grants;
      return Grant(this, tier, 0);
    }
    if (bytes > s.limit) {
      ++s.refusals;
      return refusal(s, bytes, "; more than the limit, so it can never fit");
    }
    if (tiers_[tier].queue.empty() && fits(s, bytes)) {
      s.reserved += bytes;
      note_peak(s);
      ++s.grants;
      return Grant(this, tier, bytes);
    }
    if (!tiers_[tier].queue.empty() && wait.count() == 0) {
      // Granting now would jump the queue and waiting is not allowed: refuse, and say why
      // even when the bytes alone would fit.
      ++s.refusals;
      return refusal(s, bytes,
                     "; " + std::to_string(tiers_[tier].queue.size()) +
                         " earlier requests are waiting ahead of it and wait is 0 ms");
    }
  }

  const std::uint64_t ticket = next_ticket_++;
  tiers_[tier].queue.push_back(ticket);
  // Reclaim passes: one on reaching the head short of bytes, and, when the caller waited,
  // one more at the deadline before refusing: a holder parking memory in a pool during the
  // wait does not notify us (pooled bytes stay used), so only asking again finds it.
  int reclaim_passes = 0;
  std::uint64_t reclaimed = 0;
  while (true) {
    // Re-read through tiers_ after every unlock: add_tier() may have moved the vector.
    Tier& t = tiers_[tier];
    const bool expired = std::chrono::steady_clock::now() >= deadline;
    if (t.queue.front() == ticket) {
      if (fits(t.stats, bytes)) {
        t.queue.pop_front();
        t.stats.reserved += bytes;
        note_peak(t.stats);
        ++t.stats.grants;
        changed_.notify_all();  // the next in line is now the head and may fit as well
        return Grant(this, tier, bytes);
      }
      if (reclaim_passes == 0 || (reclaim_passes == 1 && expired && wait.count() > 0)) {
        ++reclaim_passes;
        const std::uint64_t shortfall = bytes - available(t.stats);
        lock.unlock();
        try {
          reclaimed += run_reclaimers(tier, shortfall);
        } catch (...) {
          // A throwing reclaimer must not leave our ticket blocking the queue forever.
          lock.lock();
          std::deque<std::uint64_t>& q = tiers_[tier].queue;
          q.erase(std::find(q.begin(), q.end(), ticket));
          changed_.notify_all();
          throw;
        }
        lock.lock();
        continue;  // re-check before waiting: the reclaimers may have made room
      }
    }
    if (expired) break;
    changed_.wait_until(lock.native(), deadline);
  }

  // Timed out (or wait == 0 after reclaiming): leave the queue and refuse.
  Tier& t = tiers_[tier];
  const auto pos = std::find(t.queue.begin(), t.queue.end(), ticket);
  const auto ahead = static_cast<std::size_t>(pos - t.queue.begin());
  t.queue.erase(pos);
  changed_.notify_all();  // if we were the head, the next one may proceed
  ++t.stats.refusals;
  std::string why = " after reclaiming " + std::to_string(reclaimed) + " bytes";
  if (wait.count() > 0) {
    why += "; timed out after waiting " + std::to_string(wait.count()) + " ms";
    if (ahead > 0) why += " behind " + std::to_string(ahead) + " earlier requests";
  }
  return refusal(t.stats, bytes, why);
}

// Runs `tier`'s reclaimers in registration order until they report `wanted` bytes.
std::uint64_t Governor::run_reclaimers(TierId tier, std::uint64_t wanted) {
  std::uint64_t got = 0;
  std::uint64_t last_id = 0;
  while (got < wanted) {
    std::shared_ptr<Reclaimer> reclaimer;
    std::uint64_t id = 0;
    {
      // Look the next one up afresh each time, so one deregistered meanwhile is skipped.
      MutexLock lock(mutex_);
      const auto it = std::find_if(reclaimers_.begin(), reclaimers_.end(),
                                   [&](const auto& e) { return e.tier == tier && e.id > last_id; });
      if (it == reclaimers_.end()) break;
      it->runner = std::this_thread::get_id();
      id = last_id = it->id;
      reclaimer = it->reclaimer;  // a copy: the entry may go while the reclaimer runs
    }
    std::uint64_t reported = 0;
    auto finish = [&] {
      MutexLock lock(mutex_);
      const auto it = std::find_if(reclaimers_.begin(), reclaimers_.end(),
                                   [&](const auto& e) { return e.id == id; });
      if (it != reclaimers_.end()) it->runner = std::thread::id();
      tiers_[tier].stats.reclaimed += reported;
      changed_.notify_all();  // wakes a remove_reclaimer() waiting for this run to end
    };
    try {
      reported = (*reclaimer)(wanted - got);
    } catch (...) {
      finish();
      throw;
    }
    finish();
    got += reported;
  }
  return got;
}

Status Governor::charge(TierId tier, std::uint64_t bytes) {
  MutexLock lock(mutex_);
  KVVM_RETURN_IF_ERROR(check_tier(tier));
  TierStats& s = tiers_[tier].stats;
  if (bytes > s.reserved) {
    return Status::Internal("tier '" + s.name + "': a grant charged " + std::to_string(bytes) +
                            " bytes but only " + std::to_string(s.reserved) +
                            " are reserved in the tier");
  }
  s.reserved -= bytes;
  s.used += bytes;
  return Status::Ok();
}

void Governor::settle(TierId tier, std::uint64_t prepared, std::uint64_t charged,
                      std::uint64_t actual) {
  MutexLock lock(mutex_);
  TierStats& s = tiers_[tier].stats;
  // Grant guarantees charged <= actual <= prepared, and its uncharged bytes are reserved.
  s.reserved -= prepared - charged;
  s.used += actual - charged;
  if (actual < prepared) changed_.notify_all();
}

void Governor::return_bytes(TierId tier, std::uint64_t bytes) {
  std::string complaint;
  {
    MutexLock lock(mutex_);
    if (Status st = check_tier(tier); !st.ok()) {
      complaint = "return_bytes(" + std::to_string(bytes) + "): " + st.message();
    } else {
      TierStats& s = tiers_[tier].stats;
      if (bytes > s.used) {
        // A holder gave back more than the tier says it owns: a bookkeeping bug elsewhere.
        // Clamping keeps the ledger usable; counting and printing keeps the bug visible.
        complaint = "tier '" + s.name + "': return_bytes(" + std::to_string(bytes) +
                    ") exceeds used " + std::to_string(s.used) + "; clamped to 0";
        ++s.excess_returns;
        bytes = s.used;
      }
      s.used -= bytes;
      changed_.notify_all();
    }
  }
  if (!complaint.empty()) log(LogLevel::kWarning, "governor: " + complaint);
}

Status Governor::charge_direct(TierId tier, std::uint64_t bytes) {
  MutexLock lock(mutex_);
  KVVM_RETURN_IF_ERROR(check_tier(tier));
  TierStats& s = tiers_[tier].stats;
  if (!fits(s, bytes)) return refusal(s, bytes, "; charge_direct() does not fit");
  s.used += bytes;
  note_peak(s);
  return Status::Ok();
}

Governor::Registration Governor::add_reclaimer(TierId tier, Reclaimer reclaimer) {
  std::string complaint;
  {
    MutexLock lock(mutex_);
    if (Status st = check_tier(tier); !st.ok()) {
      complaint = "add_reclaimer(): " + st.message() + "; not registered";
    } else if (!reclaimer) {
      complaint = "add_reclaimer(): empty reclaimer for tier '" + tiers_[tier].stats.name +
                  "'; not registered";
    } else {
      const std::uint64_t id = next_reclaimer_++;
      reclaimers_.push_back(
          ReclaimerEntry{id, tier, std::make_shared<Reclaimer>(std::move(reclaimer)), {}});
      return Registration(this, id);
    }
  }
  log(LogLevel::kWarning, "governor: " + complaint);
  return Registration();
}

void Governor::remove_reclaimer(std::uint64_t id) {
  MutexLock lock(mutex_);
  const auto find = [&]() KVVM_REQUIRES(mutex_) {
    return std::find_if(reclaimers_.begin(), reclaimers_.end(),
                        [&](const ReclaimerEntry& e) { return e.id == id; });
  };
  // Wait for a run on another thread to end, so that once the token is gone the reclaimer is
  // never inside its owner (which is typically being destroyed). A reclaimer deregistering
  // itself from inside its own run must not wait for itself.
  changed_.wait(lock.native(), [&]() KVVM_REQUIRES(mutex_) {
    const auto it = find();
    return it == reclaimers_.end() || it->runner == std::thread::id() ||
           it->runner == std::this_thread::get_id();
  });
  const auto it = find();
  if (it != reclaimers_.end()) reclaimers_.erase(it);
}

}  // namespace kvvm
