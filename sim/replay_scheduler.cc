#include "sim/replay_scheduler.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <queue>

#include "kit/op_timing.h"

namespace kvvm::cli {
namespace {

enum class State { kPending, kQueued, kRunning, kDone };

struct Sequence {
  State state = State::kPending;
  std::uint64_t tokens = 0;  // live length (prompt at admission, then one more per step)
  std::uint64_t arrival_step = 0;
  bool admitted_once = false;
  bool preempted = false;  // in the queue to be recomputed: never rejected for waiting
};

std::string at_step(std::uint64_t step) { return "simulated step " + std::to_string(step); }

}  // namespace

Result<RunSummary> run_schedule(const Trace& trace, MemoryModel& model,
                                const SchedulerOptions& options, const ProgressFn& progress) {
  if (!(options.step_s > 0) || !(options.max_queue_wait_s >= 0)) {
    return Status::InvalidArgument("the step must be > 0 s and the queue wait >= 0 s");
  }
  const std::size_t n = trace.requests.size();
  RunSummary summary;
  summary.name = model.name();
  summary.requests = n;
  std::vector<Sequence> seqs(n);
  // Arrivals by (step, index): open-loop requests now, closed-loop ones (a later turn of a
  // conversation) when the request they follow completes.
  using Arrival = std::pair<std::uint64_t, std::size_t>;
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals;
  std::vector<std::vector<std::size_t>> followers(n);
  const auto steps_of = [&](double seconds) {
    return static_cast<std::uint64_t>(std::ceil(seconds / options.step_s - 1e-9));
  };
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t follows = trace.requests[i].follows;
    if (follows >= 0 && static_cast<std::size_t>(follows) < i) {
      followers[static_cast<std::size_t>(follows)].push_back(i);
      continue;
    }
    seqs[i].arrival_step = steps_of(trace.requests[i].arrival_s);
    arrivals.emplace(seqs[i].arrival_step, i);
  }
  // A request waits at most this many whole steps; one more and it is rejected.
  const auto wait_limit =
      static_cast<std::uint64_t>(std::floor(options.max_queue_wait_s / options.step_s + 1e-9));

  std::deque<std::size_t> queue;
  std::vector<std::size_t> running;  // admission order, oldest first
  std::vector<double> waits_s;
  std::uint64_t resolved = 0;
  double waste_bytes = 0, live_bytes = 0;  // over the whole run
  // Means are taken while requests arrive (steps 0 to the last arrival's): the drain after it
  // lasts as long as the few longest outputs, which would dilute them.
  std::uint64_t last_arrival_step = 0;

  // A request that completed at `step` sends its conversation's next turn after the think
  // time (at the next step at the earliest); one rejected or aborted ends its conversation.
  const std::function<void(std::size_t, std::uint64_t, bool)> resolve_followers =
      [&](std::size_t seq, std::uint64_t step, bool completed) {
        for (std::size_t next : followers[seq]) {
          if (completed) {
            seqs[next].arrival_step =
                std::max(step + 1, steps_of(static_cast<double>(step) * options.step_s +
                                            trace.requests[next].think_s));
            arrivals.emplace(seqs[next].arrival_step, next);
          } else {
            seqs[next].state = State::kDone;
            ++summary.abandoned;
            ++resolved;
            resolve_followers(next, step, false);
          }
        }
      };

  const auto release = [&](std::size_t seq, std::uint64_t step) -> Status {
    Status released = model.release(seq);
    if (!released.ok()) return released.with_context(at_step(step));
    return Status::Ok();
  };
  const auto preempt = [&](std::size_t seq, std::uint64_t step) -> Status {
    KVVM_RETURN_IF_ERROR(release(seq, step));
    seqs[seq].state = State::kQueued;
    seqs[seq].preempted = true;
    queue.push_front(seq);
    ++summary.preemptions;
    return Status::Ok();
  };

  for (std::uint64_t step = 0; resolved < n; ++step) {
    // 1. Arrivals.
    while (!arrivals.empty() && arrivals.top().first <= step) {
      const std::size_t seq = arrivals.top().second;
      arrivals.pop();
      seqs[seq].state = State::kQueued;
      last_arrival_step = std::max(last_arrival_step, seqs[seq].arrival_step);
      queue.push_back(seq);
    }
    // 2. Decode: every running sequence grows by one token.
    for (std::size_t i = 0; i < running.size();) {
      const std::size_t seq = running[i];
      const std::uint64_t want = seqs[seq].tokens + 1;
      bool grown = false, removed = false;
      while (!grown && !removed) {
        Result<bool> fits = model.grow(seq, want);
        if (!fits.ok()) return fits.status().with_context(at_step(step));
        if (*fits) {
          grown = true;
        } else if (running.size() == 1) {
          KVVM_RETURN_IF_ERROR(release(seq, step));
          seqs[seq].state = State::kDone;
          ++summary.aborted;
          ++resolved;
          resolve_followers(seq, step, false);
          running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
          removed = true;
        } else {
          const std::size_t victim = running.back();
          running.pop_back();
          KVVM_RETURN_IF_ERROR(preempt(victim, step));
          removed = victim == seq;
        }
      }
      if (removed) continue;
      seqs[seq].tokens = want;
      const TraceRequest& request = trace.requests[seq];
      if (want >= request.prompt_tokens + request.output_tokens) {
        KVVM_RETURN_IF_ERROR(release(seq, step));
        seqs[seq].state = State::kDone;
        ++summary.completed;
        ++resolved;
        resolve_followers(seq, step, true);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    // 3. Rejections: waited too long (preempted requests were already answered).
    if (!queue.empty()) {
      std::vector<std::size_t> rejected;
      std::erase_if(queue, [&](std::size_t seq) {
        Sequence& s = seqs[seq];
        if (s.preempted || step - s.arrival_step <= wait_limit) return false;
        s.state = State::kDone;
        ++summary.rejected;
        ++summary.queued;
        ++resolved;
        rejected.push_back(seq);
        return true;
      });
      for (std::size_t seq : rejected) resolve_followers(seq, step, false);
    }
    // 4. Admission, FIFO.
    while (!queue.empty()) {
      const std::size_t seq = queue.front();
      Sequence& s = seqs[seq];
      const TraceRequest& request = trace.requests[seq];
      const std::uint64_t tokens = s.preempted ? s.tokens : request.prompt_tokens;
      Result<bool> fits = model.admit(seq, request, tokens);
      if (!fits.ok()) return fits.status().with_context(at_step(step));
      if (!*fits) {
        if (!running.empty()) break;
        // Nothing runs and it still does not fit: it never will.
        queue.pop_front();
        s.state = State::kDone;
        ++resolved;
        resolve_followers(seq, step, false);
        if (s.preempted) {
          ++summary.aborted;
        } else {
          ++summary.rejected;
          ++summary.rejected_too_large;
          if (step > s.arrival_step) ++summary.queued;
        }
        continue;
      }
      queue.pop_front();
      if (!s.admitted_once) {
        s.admitted_once = true;
        ++summary.admitted;
        if (step > s.arrival_step) ++summary.queued;
        waits_s.push_back(static_cast<double>(step - s.arrival_step) * options.step_s);
      }
      s.state = State::kRunning;
      s.tokens = tokens;
      s.preempted = false;
      running.push_back(seq);
    }
    // 5. The sample.
    const MemorySample memory = model.sample();
    StepSample sample{static_cast<std::uint32_t>(running.size()),
                      static_cast<std::uint32_t>(queue.size()),
                      memory.committed,
                      memory.live,
                      memory.saved,
                      memory.used};
    summary.series.push_back(sample);
    summary.peak_concurrency = std::max(summary.peak_concurrency, sample.running);
    summary.peak_committed = std::max(summary.peak_committed, sample.committed);
    summary.peak_live = std::max(summary.peak_live, sample.live);
    summary.peak_used = std::max(summary.peak_used, sample.used);
    summary.peak_saved = std::max(summary.peak_saved, sample.saved);
    waste_bytes += static_cast<double>(sample.committed) - static_cast<double>(sample.live);
    live_bytes += static_cast<double>(sample.live);
    summary.steps = step + 1;
    if (progress) progress(step, summary);
  }
  const std::uint64_t mean_steps = std::min<std::uint64_t>(summary.steps, last_arrival_step + 1);
  double sum_running = 0, sum_committed = 0, sum_live = 0, sum_saved = 0;
  for (std::uint64_t step = 0; step < mean_steps; ++step) {
    const StepSample& sample = summary.series[step];
    sum_running += sample.running;
    sum_committed += static_cast<double>(sample.committed);
    sum_live += static_cast<double>(sample.live);
    sum_saved += static_cast<double>(sample.saved);
  }
  const double steps = static_cast<double>(std::max<std::uint64_t>(mean_steps, 1));
  summary.simulated_s = static_cast<double>(summary.steps) * options.step_s;
  summary.mean_concurrency = sum_running / steps;
  summary.mean_committed = sum_committed / steps;
  summary.mean_live = sum_live / steps;
  summary.mean_saved = sum_saved / steps;
  summary.waste_ratio = live_bytes > 0 ? waste_bytes / live_bytes : 0.0;
  summary.cache = model.cache();
  if (!waits_s.empty()) {
    double total = 0;
    for (double wait : waits_s) total += wait;
    summary.mean_wait_s = total / static_cast<double>(waits_s.size());
    summary.p99_wait_s = percentile(waits_s, 99);
  }
  return summary;
}

}  // namespace kvvm::cli
