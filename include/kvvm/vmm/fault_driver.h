// The fault-injecting driver: wraps any driver and fails chosen calls, so that every
// rollback path is forced in tests rather than hoped for.
//
// An injected failure does nothing in the wrapped driver and returns DriverError with
// error_name "KVVM_INJECTED_FAULT" and the call's name. A failed fence therefore returns before
// the work before it completed, which is what a real failed synchronization means: that work's
// completion is unknown.
//
// Copies in flight: whatever the wrapped driver does (the host copies at once), a copy counts
// as running, as on a GPU, from when it is queued until a fence recorded after it on its stream
// is seen complete (fence_done true, or a successful wait) or synchronize() succeeds. An unmap
// or a free over memory a copy in flight reads or writes breaks invariant 6 (on a GPU the copy
// would write unmapped memory and the context would die): it is recorded as a violation, which
// the tests' invariant check reports, and still carried out. So every sweep proves the rule on
// the host too, without depending on timing; on a GPU delay_copies() makes the hazard real.
//
// Thread-safety: safe to call from several threads; the plan may be changed at any time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvvm/base/mutex.h"
#include "kvvm/vmm/driver.h"

namespace kvvm {

class FaultDriver final : public Driver {
 public:
  // `inner` must outlive this driver.
  explicit FaultDriver(Driver& inner) : inner_(inner) {}

  // Fails the k-th call (1-based, counted from now) of `op`. One plan per op.
  void fail_nth(DriverOp op, std::uint64_t k);
  // Fails the k-th call (1-based, counted from now) of any kind.
  void fail_nth_call(std::uint64_t k);
  // Fails each call of `op` with probability `fraction`, drawn from a generator seeded
  // with `seed` (reproducible).
  void fail_fraction(DriverOp op, double fraction, std::uint64_t seed);
  // While on, every fence recorded reports not done (as a GPU's does while the stream is
  // still running the work before it) until it is waited for or this is turned off.
  void hold_fences(bool on);
  // Removes every plan (held fences stay held, copies in flight stay in flight).
  void clear();
  // Faults injected so far.
  std::uint64_t injected() const;

  // While set, called with the copy's stream right before each copy is queued (an error stops
  // the copy): a GPU test makes the stream busy (a kernel that spins) so that the copy is truly
  // still running when a fence after it fails.
  void delay_copies(std::function<Status(Stream)> delay);
  // Copies queued and not yet known complete.
  std::size_t copies_in_flight() const;
  // Every unmap or free made over a copy in flight, described; empty when none was.
  std::vector<std::string> in_flight_violations() const;

  DriverInfo info() const override { return inner_.info(); }
  Granularity granularity() const override { return inner_.granularity(); }
  bool maps_handle_subranges() const override { return inner_.maps_handle_subranges(); }
  Driver& inner() { return inner_; }

 private:
  Status maybe_fail(DriverOp op);

  Result<Address> do_reserve(std::size_t bytes, std::size_t alignment) override;
  Status do_free(Address base, std::size_t bytes) override;
  Result<Handle> do_create(std::size_t bytes) override;
  Status do_release(Handle handle) override;
  Status do_map(Address address, std::size_t bytes, Handle handle,
                std::size_t handle_offset) override;
  Status do_set_access(Address address, std::size_t bytes, Access access) override;
  Status do_unmap(Address address, std::size_t bytes) override;
  Status do_synchronize() override;
  Status do_write(Address address, const void* source, std::size_t bytes) override;
  Status do_read(void* destination, Address address, std::size_t bytes) override;
  Result<Fence> do_record_fence(Stream stream) override;
  Result<bool> do_fence_done(Fence fence) override;
  Status do_destroy_fence(Fence fence) override;
  Status do_copy(Address destination, Address source, std::size_t bytes, Stream stream) override;
  Status do_wait_fence(Fence fence) override;
  Result<int> do_export_handle(Handle handle) override;
  Result<Handle> do_import_handle(int fd, std::size_t bytes) override;

  struct Plan {
    std::uint64_t countdown = 0;  // fail when it reaches 1; 0: off
    double fraction = 0.0;
    std::mt19937_64 random;
  };
  struct CopyInFlight {
    Address destination = 0;
    Address source = 0;
    std::size_t bytes = 0;
    Stream stream = nullptr;
    std::uint64_t number = 0;  // queue order
  };
  // Where a fence stands: after the copies of its stream numbered below `copies_before`.
  struct FenceMark {
    Stream stream = nullptr;
    std::uint64_t copies_before = 0;
  };
  // The fence completed: the copies queued before it on its stream did too.
  void complete_before(Fence fence) KVVM_REQUIRES(mutex_);
  // Records a violation when [address, address + bytes) meets a copy in flight.
  void check_not_in_flight(std::string_view what, Address address, std::size_t bytes)
      KVVM_EXCLUDES(mutex_);

  Driver& inner_;
  mutable Mutex mutex_;
  std::array<Plan, kDriverOpCount> plans_ KVVM_GUARDED_BY(mutex_){};
  std::uint64_t any_countdown_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint64_t injected_ KVVM_GUARDED_BY(mutex_) = 0;
  bool holding_fences_ KVVM_GUARDED_BY(mutex_) = false;
  std::set<Fence> held_fences_ KVVM_GUARDED_BY(mutex_);
  std::function<Status(Stream)> delay_ KVVM_GUARDED_BY(mutex_);
  std::vector<CopyInFlight> copies_ KVVM_GUARDED_BY(mutex_);
  std::uint64_t copies_queued_ KVVM_GUARDED_BY(mutex_) = 0;
  std::map<Fence, FenceMark> marks_ KVVM_GUARDED_BY(mutex_);
  std::vector<std::string> violations_ KVVM_GUARDED_BY(mutex_);
};

}  // namespace kvvm
