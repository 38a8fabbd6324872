// Tests of the CUDA driver (src/vmm/cuda_driver.cc) with a GPU (skipped without one): errors
// that name the failing call, exhaustion, call counters and use from many threads and drivers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvvm/vmm/cuda_driver.h"
#include "support/cuda_driver_fixture.h"
#include "vmm/cuda_api.h"

namespace kvvm {
namespace {

using testing::Bytes;
using testing::CudaDriverTest;
using testing::random_bytes;
using testing::same_bytes;
using testing::say;
using testing::unavailable_reason;

TEST_F(CudaDriverTest, OutOfRangeMapIsADriverErrorNamingCuMemMap) {
  Handle handle = kNoHandle;
  KVVM_CUDA_ASSIGN_OR_FAIL(handle, create(g_));
  Address base = 0;
  KVVM_CUDA_ASSIGN_OR_FAIL(base, reserve(2 * g_));
  const auto before = driver_->counts();

  struct Case {
    const char* key;
    const char* what;
    std::size_t bytes;
    std::size_t offset;
  };
  for (const Case c :
       {Case{"past_handle_end", "more bytes than the handle has", 2 * g_, 0},
        Case{"offset_past_handle_end", "an offset past the end of the handle", g_, g_}}) {
    SCOPED_TRACE(c.what);
    const Status status = map(base, c.bytes, handle, c.offset);
    say(std::string("cuda_map_") + c.key, status.to_string());
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), StatusCode::kDriverError) << status.to_string();
    ASSERT_TRUE(status.driver_failure().has_value());
    EXPECT_EQ(status.driver_failure()->call, "cuMemMap");
    EXPECT_EQ(status.driver_failure()->error_name.rfind("CUDA_ERROR_", 0), 0u)
        << status.driver_failure()->error_name;
    EXPECT_NE(status.driver_failure()->error_code, 0);
    EXPECT_NE(status.message().find("cuMemMap("), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(std::to_string(c.bytes) + " bytes"), std::string::npos)
        << status.message();
  }
  const auto after = driver_->counts();
  EXPECT_EQ(after.of(DriverOp::kMap) - before.of(DriverOp::kMap), 2u);
  EXPECT_EQ(after.failed(DriverOp::kMap) - before.failed(DriverOp::kMap), 2u);
  // The failures changed nothing: the whole handle still maps there.
  KVVM_CUDA_ASSERT_OK(map(base, g_, handle));
}

TEST_F(CudaDriverTest, CreateBeyondDeviceMemoryIsResourceExhausted) {
  const DriverInfo info = driver_->info();
  ASSERT_GT(info.total_bytes, 0u);
  const std::size_t bytes = (info.total_bytes / g_ + 1) * g_;
  Result<Handle> handle = create(bytes);
  say("cuda_create_beyond_device_memory", handle.status().to_string());
  ASSERT_FALSE(handle.ok()) << "cuMemCreate(" << bytes << " bytes) succeeded on a device of "
                            << info.total_bytes << " bytes";
  const Status status = handle.status();
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  ASSERT_TRUE(status.exhaustion().has_value()) << status.to_string();
  EXPECT_EQ(status.exhaustion()->requested, bytes);
  EXPECT_EQ(status.exhaustion()->limit, info.total_bytes);
  EXPECT_LE(status.exhaustion()->available, status.exhaustion()->limit);
  EXPECT_NE(status.message().find("cuMemCreate"), std::string::npos) << status.message();
  EXPECT_EQ(driver_->counts().failed(DriverOp::kCreate), 1u);
}

TEST_F(CudaDriverTest, CountersReflectTheCalls) {
  EXPECT_EQ(driver_->counts().total(), 0u);
  Address base = 0;
  KVVM_CUDA_ASSIGN_OR_FAIL(base, driver_->reserve(g_));
  Handle handle = kNoHandle;
  KVVM_CUDA_ASSIGN_OR_FAIL(handle, driver_->create(g_));
  KVVM_CUDA_ASSERT_OK(driver_->map(base, g_, handle, 0));
  KVVM_CUDA_ASSERT_OK(driver_->set_access(base, g_, Access::kReadWrite));
  const Bytes pattern = random_bytes(4096, 31);
  KVVM_CUDA_ASSERT_OK(driver_->write(base, pattern.data(), pattern.size()));
  Bytes actual(pattern.size());
  KVVM_CUDA_ASSERT_OK(driver_->read(actual.data(), base, actual.size()));
  EXPECT_FALSE(driver_->map(base, g_, handle, 0).ok());  // already mapped there
  KVVM_CUDA_ASSERT_OK(driver_->synchronize());
  KVVM_CUDA_ASSERT_OK(driver_->unmap(base, g_));
  KVVM_CUDA_ASSERT_OK(driver_->release(handle));
  KVVM_CUDA_ASSERT_OK(driver_->free(base, g_));

  const DriverCallCounts counts = driver_->counts();
  EXPECT_EQ(counts.of(DriverOp::kReserve), 1u);
  EXPECT_EQ(counts.of(DriverOp::kCreate), 1u);
  EXPECT_EQ(counts.of(DriverOp::kMap), 2u);
  EXPECT_EQ(counts.failed(DriverOp::kMap), 1u);
  EXPECT_EQ(counts.of(DriverOp::kSetAccess), 1u);
  EXPECT_EQ(counts.of(DriverOp::kCopy), 2u);
  EXPECT_EQ(counts.of(DriverOp::kSynchronize), 1u);
  EXPECT_EQ(counts.of(DriverOp::kUnmap), 1u);
  EXPECT_EQ(counts.of(DriverOp::kRelease), 1u);
  EXPECT_EQ(counts.of(DriverOp::kFree), 1u);
  EXPECT_EQ(counts.total(), 11u);
  std::uint64_t failures = 0;
  for (std::uint64_t n : counts.failures) failures += n;
  EXPECT_EQ(failures, 1u);
}

TEST_F(CudaDriverTest, CallsFromManyThreadsEachMakeTheContextCurrent) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 6;
  std::mutex mutex;
  std::vector<std::string> errors;
  auto note = [&](const std::string& error) {
    std::lock_guard lock(mutex);
    errors.push_back(error);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const std::size_t bytes = (1 + static_cast<std::size_t>(round % 2)) * g_;
        auto base = driver_->reserve(bytes);
        if (!base.ok()) return note(base.status().to_string());
        auto handle = driver_->create(bytes);
        if (!handle.ok()) return note(handle.status().to_string());
        const Bytes pattern =
            random_bytes(bytes, 1000 + static_cast<std::uint64_t>(t * 100 + round));
        Bytes actual(bytes);
        for (const Status& status :
             {driver_->map(*base, bytes, *handle, 0),
              driver_->set_access(*base, bytes, Access::kReadWrite),
              driver_->write(*base, pattern.data(), bytes),
              driver_->read(actual.data(), *base, bytes), driver_->unmap(*base, bytes),
              driver_->release(*handle), driver_->free(*base, bytes)}) {
          if (!status.ok()) return note(status.to_string());
        }
        if (actual != pattern) return note("bytes differ in thread " + std::to_string(t));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(errors.empty()) << errors.size() << " errors, first: " << errors.front();
  EXPECT_EQ(driver_->counts().of(DriverOp::kMap), std::uint64_t{kThreads * kRounds});
}

TEST_F(CudaDriverTest, TwoDriversShareThePrimaryContextAndOutliveEachOther) {
  Address base = 0;
  KVVM_CUDA_ASSIGN_OR_FAIL(base, fresh_read_write(g_));
  const Bytes pattern = random_bytes(g_, 41);
  KVVM_CUDA_ASSERT_OK(driver_->write(base, pattern.data(), g_));
  {
    auto second = make_cuda_driver();
    ASSERT_TRUE(second.ok()) << second.status().to_string();
    Bytes actual(g_);
    // The same context: the second driver reads what the first wrote.
    KVVM_CUDA_ASSERT_OK((*second)->read(actual.data(), base, g_));
    EXPECT_TRUE(same_bytes(pattern, actual));
  }
  // Releasing the second driver's reference left the first one's memory and context intact.
  Bytes actual;
  KVVM_CUDA_ASSIGN_OR_FAIL(actual, read(base, g_));
  EXPECT_TRUE(same_bytes(pattern, actual));
}

}  // namespace
}  // namespace kvvm
