// CommitAhead on its own: it runs the jobs its owner hands out, never holds the owner's lock
// while a job runs, marks its thread while it does, and stops cleanly.
#include "kv/commit_ahead.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "kvvm/base/mutex.h"

namespace kvvm {
namespace {

TEST(CommitAheadTest, RunsEveryJobOutsideTheLockAndPublishesUnderIt) {
  Mutex mutex;
  std::condition_variable changed;
  std::vector<std::uint64_t> pending{3, 5, 8};
  std::vector<std::uint64_t> done;
  int busy = 0;  // a claim, as the owner's slot flags
  bool lock_free_while_running = true;
  bool marked_while_running = true;
  CommitAhead::Hooks hooks;
  hooks.next = [&]() -> std::optional<CommitAhead::Job> {
    if (pending.empty()) return std::nullopt;
    ++busy;
    const std::uint64_t to = pending.back();
    pending.pop_back();
    return CommitAhead::Job{0, 0, to, false};
  };
  hooks.run = [&](CommitAhead::Job& job) {
    // The owner's lock is free: another thread could take it now. The test's own thread
    // takes it briefly to check its wait condition, so one try may meet it there; a job run
    // under the lock would hold it throughout, so one success within a second tells them
    // apart.
    bool taken = false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!taken && std::chrono::steady_clock::now() < until) {
      std::unique_lock probe(mutex.native(), std::try_to_lock);
      taken = probe.owns_lock();
      if (!taken) std::this_thread::yield();
    }
    lock_free_while_running = lock_free_while_running && taken;
    marked_while_running = marked_while_running && CommitAhead::running_here();
    return job.to == 5 ? Status::Unavailable("no") : Status::Ok();
  };
  hooks.finish = [&](const CommitAhead::Job& job, const Status& status) {
    --busy;
    if (status.ok()) done.push_back(job.to);
  };
  {
    CommitAhead ahead(mutex, changed, hooks);
    MutexLock lock(mutex);
    ASSERT_TRUE(changed.wait_for(lock.native(), std::chrono::seconds(10),
                                 [&] { return pending.empty() && busy == 0; }));
  }
  EXPECT_EQ(done, (std::vector<std::uint64_t>{8, 3}));
  EXPECT_TRUE(lock_free_while_running);
  EXPECT_TRUE(marked_while_running);
  EXPECT_FALSE(CommitAhead::running_here()) << "only the worker's thread is marked";
}

TEST(CommitAheadTest, WaitsForWorkAndStopsWithNone) {
  Mutex mutex;
  std::condition_variable changed;
  bool available = false;
  int ran = 0;
  CommitAhead::Hooks hooks;
  hooks.next = [&]() -> std::optional<CommitAhead::Job> {
    if (!available) return std::nullopt;
    available = false;
    return CommitAhead::Job{};
  };
  hooks.run = [&](CommitAhead::Job&) { return Status::Ok(); };
  hooks.finish = [&](const CommitAhead::Job&, const Status&) { ++ran; };
  CommitAhead ahead(mutex, changed, hooks);
  {
    MutexLock lock(mutex);
    available = true;
  }
  changed.notify_all();
  MutexLock lock(mutex);
  ASSERT_TRUE(changed.wait_for(lock.native(), std::chrono::seconds(10), [&] { return ran == 1; }));
  lock.unlock();
  // Destruction with nothing to do returns (the test would hang otherwise).
}

}  // namespace
}  // namespace kvvm
