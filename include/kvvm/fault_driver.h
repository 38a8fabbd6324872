// The fault-injecting driver: wraps any driver and fails chosen calls, so that every
// rollback path is forced in tests rather than hoped for.
//
// An injected failure does nothing in the wrapped driver and returns DriverError with
// error_name "KVVM_INJECTED_FAULT" and the call's name.
//
// Thread-safety: safe to call from several threads; the plan may be changed at any time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <set>

#include "kvvm/driver.h"
#include "kvvm/mutex.h"

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
  // Removes every plan (held fences stay held).
  void clear();
  // Faults injected so far.
  std::uint64_t injected() const;

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

  struct Plan {
    std::uint64_t countdown = 0;  // fail when it reaches 1; 0: off
    double fraction = 0.0;
    std::mt19937_64 random;
  };

  Driver& inner_;
  mutable Mutex mutex_;
  std::array<Plan, kDriverOpCount> plans_ KVVM_GUARDED_BY(mutex_){};
  std::uint64_t any_countdown_ KVVM_GUARDED_BY(mutex_) = 0;
  std::uint64_t injected_ KVVM_GUARDED_BY(mutex_) = 0;
  bool holding_fences_ KVVM_GUARDED_BY(mutex_) = false;
  std::set<Fence> held_fences_ KVVM_GUARDED_BY(mutex_);
};

}  // namespace kvvm
