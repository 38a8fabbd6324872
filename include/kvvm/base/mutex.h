// Mutex and MutexLock: std::mutex with Clang's thread-safety annotations, so which lock guards
// a member and which lock a function needs held (or not held) are stated in code a compiler
// checks, not in comments: `scripts/test.sh` compiles every annotated file with
// `clang++ -Wthread-safety -Werror` (GCC ignores the attributes). The analysis is per function
// and intraprocedural; it proves that annotated members are touched under their lock and that
// REQUIRES / EXCLUDES hold at every call the compiler sees.
#pragma once

#include <mutex>

#if defined(__clang__)
#define KVVM_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVVM_THREAD_ANNOTATION(x)
#endif

#define KVVM_CAPABILITY(x) KVVM_THREAD_ANNOTATION(capability(x))
#define KVVM_SCOPED_CAPABILITY KVVM_THREAD_ANNOTATION(scoped_lockable)
#define KVVM_GUARDED_BY(x) KVVM_THREAD_ANNOTATION(guarded_by(x))
#define KVVM_PT_GUARDED_BY(x) KVVM_THREAD_ANNOTATION(pt_guarded_by(x))
#define KVVM_REQUIRES(...) KVVM_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define KVVM_EXCLUDES(...) KVVM_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define KVVM_ACQUIRE(...) KVVM_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define KVVM_RELEASE(...) KVVM_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define KVVM_RETURN_CAPABILITY(x) KVVM_THREAD_ANNOTATION(lock_returned(x))
// For the rare function whose locking the analysis cannot follow (say why beside it).
#define KVVM_NO_THREAD_SAFETY_ANALYSIS KVVM_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace kvvm {

class KVVM_CAPABILITY("mutex") Mutex {
 public:
  void lock() KVVM_ACQUIRE() { mutex_.lock(); }
  void unlock() KVVM_RELEASE() { mutex_.unlock(); }
  // The std::mutex itself, for a std::condition_variable's wait (see MutexLock::native).
  std::mutex& native() { return mutex_; }

 private:
  std::mutex mutex_;
};

// Holds a Mutex for its scope; unlock() / lock() let go of it and take it back in between
// (around a driver call, say), and native() lends the underlying lock to a
// std::condition_variable, whose wait gives the mutex back held.
class KVVM_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) KVVM_ACQUIRE(mutex) : lock_(mutex.native()) {}
  // Not held yet: lock() takes it, the scope's end releases it if held.
  MutexLock(Mutex& mutex, std::defer_lock_t) KVVM_EXCLUDES(mutex)
      : lock_(mutex.native(), std::defer_lock) {}
  ~MutexLock() KVVM_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() KVVM_RELEASE() { lock_.unlock(); }
  void lock() KVVM_ACQUIRE() { lock_.lock(); }
  // Whether it holds the mutex now: for code handed a lock that takes it only if not held,
  // which the analysis cannot follow (such a function opts out, saying why).
  bool owns_lock() const { return lock_.owns_lock(); }
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace kvvm
