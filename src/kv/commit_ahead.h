// CommitAhead: the background worker that commits memory before it is asked for, so the decode
// path normally finds its windows mapped.
//
// It owns the thread and its stop flag, and nothing else: which job comes next, how it is
// committed and what its outcome changes belong to its owner, through three hooks. The owner's
// mutex guards the owner's state; the worker holds it while it waits and while `next` and
// `finish` run, and never while `run` makes driver calls.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

#include "kvvm/base/mutex.h"
#include "kvvm/base/status.h"

namespace kvvm {

class CommitAhead {
 public:
  struct Job {
    std::uint32_t slot = 0;
    std::uint64_t from = 0;  // windows [from, to) per fragment
    std::uint64_t to = 0;
    bool poisoned = false;  // set by `run` when a failure left a mapping in an unknown state
  };
  // A std::function carries no lock annotation: the owner's lambdas state them.
  struct Hooks {
    // Under the lock: the next job, claimed by the owner for the worker; nullopt: none now
    // (the worker waits for the owner's condition variable).
    std::function<std::optional<Job>()> next;
    // Without the lock: commits the job.
    std::function<Status(Job&)> run;
    // Under the lock: publishes the job's outcome and ends the claim.
    std::function<void(const Job&, const Status&)> finish;
  };

  // Starts the worker.
  CommitAhead(Mutex& mutex, std::condition_variable& changed, Hooks hooks);
  CommitAhead(const CommitAhead&) = delete;
  CommitAhead& operator=(const CommitAhead&) = delete;
  // Stops and joins the worker.
  ~CommitAhead() KVVM_EXCLUDES(mutex_);

  // True on the worker's thread while a job runs: what it commits is a convenience, not a
  // claim on memory, so its grants must not make anyone reclaim (two sequences' leads would
  // evict each other forever when the budget holds only one).
  static bool running_here();

 private:
  void loop() KVVM_EXCLUDES(mutex_);

  Mutex& mutex_;
  std::condition_variable& changed_;
  const Hooks hooks_;
  bool stopping_ KVVM_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace kvvm
