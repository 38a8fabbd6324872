// CommitAhead: see commit_ahead.h.
#include "kv/commit_ahead.h"

#include <utility>

namespace kvvm {
namespace {

thread_local bool running_job = false;

}  // namespace

CommitAhead::CommitAhead(Mutex& mutex, std::condition_variable& changed, Hooks hooks)
    : mutex_(mutex), changed_(changed), hooks_(std::move(hooks)) {
  thread_ = std::thread([this] { loop(); });
}

CommitAhead::~CommitAhead() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool CommitAhead::running_here() { return running_job; }

void CommitAhead::loop() {
  MutexLock lock(mutex_);
  while (true) {
    std::optional<Job> job;
    changed_.wait(lock.native(), [&]() KVVM_REQUIRES(mutex_) {
      if (stopping_) return true;
      job = hooks_.next();
      return job.has_value();
    });
    if (stopping_) return;  // checked before `next`: no job was claimed
    lock.unlock();
    running_job = true;
    Status status = hooks_.run(*job);
    running_job = false;
    lock.lock();
    hooks_.finish(*job, status);
    changed_.notify_all();
  }
}

}  // namespace kvvm
