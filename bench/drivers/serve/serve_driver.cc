#include "bench/drivers/serve/serve_driver.h"

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

namespace kvvm::cli {
namespace {

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

Clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// How often cancelled requests are closed again until their threads return: a cancel that
// lands before the connection exists closes nothing, so it is repeated.
constexpr auto kCancelRepeat = std::chrono::milliseconds(20);

}  // namespace

DriverRun run_open_loop(const std::vector<PlannedRequest>& plan, const DriverSettings& settings) {
  DriverRun run;
  run.requests.resize(plan.size());
  std::vector<std::shared_ptr<StreamingCall>> calls(plan.size());
  std::vector<std::thread> threads(plan.size());
  std::vector<bool> done(plan.size(), false);
  std::vector<std::size_t> finished;  // ended, not yet joined
  std::size_t in_flight = 0;
  std::mutex mutex;
  std::condition_variable changed;

  const auto join_finished = [&](std::unique_lock<std::mutex>& lock) {
    std::vector<std::size_t> ready;
    ready.swap(finished);
    lock.unlock();
    for (std::size_t i : ready) threads[i].join();
    lock.lock();
  };

  run.start = Clock::now();
  const Clock::time_point start = run.start;
  // A plain time point beside a flag: GCC's -O3 flow analysis misreads an optional one.
  const bool bounded = settings.duration_s.has_value();
  const Clock::time_point stop_at =
      bounded ? start + to_duration(*settings.duration_s) : Clock::time_point{};
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Clock::time_point due = start + to_duration(plan[i].arrival_s);
    if (bounded && due >= stop_at) break;
    std::this_thread::sleep_until(due);
    std::unique_lock<std::mutex> lock(mutex);
    join_finished(lock);
    if (settings.concurrency_limit > 0) {
      const auto has_room = [&] { return in_flight < settings.concurrency_limit; };
      if (bounded) {
        if (!changed.wait_until(lock, stop_at, has_room)) break;
      } else {
        // Bounded: every request in flight ends within its reads' timeouts.
        changed.wait(lock, has_room);
      }
      join_finished(lock);
    }
    IssuedRequest& issued = run.requests[i];
    const Clock::time_point issue_time = Clock::now();
    issued.sent = true;
    issued.issued_s = seconds_between(start, issue_time);
    auto call = std::make_shared<StreamingCall>(settings.client, settings.path, plan[i].body,
                                                settings.chat);
    calls[i] = call;
    ++in_flight;
    try {
      threads[i] = std::thread([&, i, call, issue_time] {
        StreamOutcome outcome = call->run();
        std::lock_guard<std::mutex> guard(mutex);
        IssuedRequest& ended = run.requests[i];
        ended.ended_s = seconds_between(start, outcome.end);
        if (outcome.first_token) ended.ttft_s = seconds_between(issue_time, *outcome.first_token);
        if (outcome.last_token) {
          ended.last_token_s = seconds_between(issue_time, *outcome.last_token);
        }
        ended.outcome = std::move(outcome);
        calls[i].reset();  // its connection is closed: nothing left to cancel
        done[i] = true;
        finished.push_back(i);
        --in_flight;
        changed.notify_all();
      });
    } catch (const std::system_error& error) {
      // Out of threads: the request could not be sent, which the report shows as an error
      // rather than the bench stopping.
      --in_flight;
      done[i] = true;
      issued.outcome.kind = OutcomeKind::kConnection;
      issued.outcome.error = std::string("could not start a thread: ") + error.what();
      issued.outcome.end = Clock::now();
      issued.ended_s = seconds_between(start, issued.outcome.end);
    }
  }

  std::unique_lock<std::mutex> lock(mutex);
  run.issue_stopped_s = seconds_between(start, Clock::now());
  // A --duration run lasts its duration whenever its trace ran out: the grace starts at its
  // end (requests in flight are measured, not cut short, until then).
  const Clock::time_point grace_end =
      std::max(Clock::now(), bounded ? stop_at : start) + to_duration(settings.grace_s);
  changed.wait_until(lock, grace_end, [&] { return in_flight == 0; });
  // Past the grace: close what is still open until every thread has returned. A thread that
  // has not connected yet gives up within the connection timeout, so this ends.
  while (in_flight > 0) {
    std::vector<std::shared_ptr<StreamingCall>> open;
    for (std::size_t i = 0; i < plan.size(); ++i) {
      if (calls[i] && !done[i]) open.push_back(calls[i]);
    }
    lock.unlock();
    for (const auto& call : open) call->cancel();
    lock.lock();
    changed.wait_for(lock, kCancelRepeat, [&] { return in_flight == 0; });
  }
  run.finished_s = seconds_between(start, Clock::now());
  lock.unlock();
  for (std::thread& thread : threads) {
    if (thread.joinable()) thread.join();
  }
  return run;
}

}  // namespace kvvm::cli
