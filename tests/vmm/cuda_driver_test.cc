// Tests of the CUDA driver (src/vmm/cuda_driver.cc).
//
// Without a usable GPU every test that needs one is skipped, with the reason; the tests of
// what make_cuda_driver says when there is no device run everywhere.
//
// Where CUDA's documentation leaves a behaviour open (one cuMemSetAccess or cuMemUnmap over
// several mappings, access changes on part of a mapping) the test states what we expect and
// prints what CUDA did, as a line starting with "[ CUDA ]", so one run on a GPU tells the truth.
// This file: granularity, device info, round trips and how mappings combine.
#include "kvvm/vmm/cuda_driver.h"

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

TEST_F(CudaDriverTest, GranularityIsNonZeroPowersOfTwoMinimumDividesRecommended) {
  const Granularity granularity = driver_->granularity();
  say("cuda_granularity", "minimum " + std::to_string(granularity.minimum) + ", recommended " +
                              std::to_string(granularity.recommended));
  ASSERT_GT(granularity.minimum, 0u);
  ASSERT_GT(granularity.recommended, 0u);
  EXPECT_EQ(granularity.minimum & (granularity.minimum - 1), 0u);
  EXPECT_EQ(granularity.recommended & (granularity.recommended - 1), 0u);
  EXPECT_EQ(granularity.recommended % granularity.minimum, 0u);
  EXPECT_EQ(driver_->granule(), granularity.minimum);
}

TEST_F(CudaDriverTest, InfoDescribesTheDevice) {
  const DriverInfo info = driver_->info();
  say("cuda_info", info.device_name + ", device " + std::to_string(info.device_ordinal) +
                       ", driver " + info.driver_version + ", " + std::to_string(info.free_bytes) +
                       " free of " + std::to_string(info.total_bytes));
  EXPECT_EQ(info.backend, "cuda");
  EXPECT_FALSE(info.device_name.empty());
  EXPECT_EQ(info.device_ordinal, 0);
  EXPECT_TRUE(info.vmm_supported);
  EXPECT_GT(info.total_bytes, 0u);
  EXPECT_LE(info.free_bytes, info.total_bytes);
  const auto dot = info.driver_version.find('.');
  ASSERT_NE(dot, std::string::npos) << info.driver_version;
  EXPECT_GT(dot, 0u);
  EXPECT_LT(dot + 1, info.driver_version.size());
}

TEST_F(CudaDriverTest, RoundTripsRandomBytesOverGranulesAndHandles) {
  struct Case {
    std::size_t granules;
    std::size_t per_handle;  // granules per handle
  };
  std::uint64_t seed = 1;
  for (const Case c : {Case{1, 1}, Case{2, 1}, Case{2, 2}, Case{5, 1}, Case{5, 5}}) {
    SCOPED_TRACE(std::to_string(c.granules) + " granules, handles of " +
                 std::to_string(c.per_handle));
    const std::size_t bytes = c.granules * g_;
    Address base = 0;
    KVVM_CUDA_ASSIGN_OR_FAIL(base, reserve(bytes));
    EXPECT_EQ(base % g_, 0u);
    for (std::size_t i = 0; i < c.granules; i += c.per_handle) {
      Handle handle = kNoHandle;
      KVVM_CUDA_ASSIGN_OR_FAIL(handle, create(c.per_handle * g_));
      EXPECT_NE(handle, kNoHandle);
      KVVM_CUDA_ASSERT_OK(map(base + i * g_, c.per_handle * g_, handle));
      KVVM_CUDA_ASSERT_OK(
          driver_->set_access(base + i * g_, c.per_handle * g_, Access::kReadWrite));
    }
    Bytes expected = random_bytes(bytes, seed++);
    KVVM_CUDA_ASSERT_OK(driver_->write(base, expected.data(), bytes));
    Bytes actual;
    KVVM_CUDA_ASSIGN_OR_FAIL(actual, read(base, bytes));
    EXPECT_TRUE(same_bytes(expected, actual));

    // An unaligned patch; with two granules or more it crosses the first boundary (and, with
    // one handle per granule, the boundary between two mappings).
    const std::size_t at = c.granules > 1 ? g_ - 4093 : 4093;
    const std::size_t length = std::min<std::size_t>(8191, bytes - at);
    const Bytes patch = random_bytes(length, seed++);
    KVVM_CUDA_ASSERT_OK(driver_->write(base + at, patch.data(), length));
    std::copy(patch.begin(), patch.end(), expected.begin() + static_cast<std::ptrdiff_t>(at));
    KVVM_CUDA_ASSIGN_OR_FAIL(actual, read(base, bytes));
    EXPECT_TRUE(same_bytes(expected, actual));
  }
}

TEST_F(CudaDriverTest, MapsGranuleAlignedSubRangesOfAMultiGranuleHandle) {
  // The header of cuMemMap says of `offset` "currently must be zero", while its description
  // says offset must be a multiple of the granularity. kvvm relies on the second.
  constexpr std::size_t kGranules = 3;
  Handle handle = kNoHandle;
  KVVM_CUDA_ASSIGN_OR_FAIL(handle, create(kGranules * g_));
  Address whole = 0;
  KVVM_CUDA_ASSIGN_OR_FAIL(whole, reserve(kGranules * g_));
  KVVM_CUDA_ASSERT_OK(map(whole, kGranules * g_, handle));
  KVVM_CUDA_ASSERT_OK(driver_->set_access(whole, kGranules * g_, Access::kReadWrite));
  const Bytes pattern = random_bytes(kGranules * g_, 7);
  KVVM_CUDA_ASSERT_OK(driver_->write(whole, pattern.data(), pattern.size()));

  // Each granule of the handle, mapped on its own, in reverse order, at a second address.
  Address reversed = 0;
  KVVM_CUDA_ASSIGN_OR_FAIL(reversed, reserve(kGranules * g_));
  std::string outcome;
  for (std::size_t k = 0; k < kGranules; ++k) {
    const Address at = reversed + (kGranules - 1 - k) * g_;
    const Status status = map(at, g_, handle, k * g_);
    outcome += (k == 0 ? "" : "; ") + std::string("offset ") + std::to_string(k * g_) + ": " +
               status.to_string();
    if (!status.ok() && !driver_->maps_handle_subranges()) {
      // The driver says it maps whole handles only; CUDA must then refuse, not corrupt.
      say("cuda_map_handle_sub_ranges", outcome);
      ASSERT_TRUE(status.driver_failure().has_value()) << status.to_string();
      EXPECT_EQ(status.driver_failure()->error_name, "CUDA_ERROR_NOT_SUPPORTED");
      return;
    }
    ASSERT_TRUE(status.ok()) << "mapping granule " << k << " of a " << kGranules
                             << "-granule handle: " << status.to_string();
    KVVM_CUDA_ASSERT_OK(driver_->set_access(at, g_, Access::kReadWrite));
  }
  say("cuda_map_handle_sub_ranges", outcome);
  Bytes actual;
  KVVM_CUDA_ASSIGN_OR_FAIL(actual, read(reversed, kGranules * g_));
  Bytes expected;
  for (std::size_t k = kGranules; k-- > 0;) {
    expected.insert(expected.end(), pattern.begin() + static_cast<std::ptrdiff_t>(k * g_),
                    pattern.begin() + static_cast<std::ptrdiff_t>((k + 1) * g_));
  }
  EXPECT_TRUE(same_bytes(expected, actual));

  // And it is the same memory: a write through the sub-range mapping shows in the whole.
  const Bytes patch = random_bytes(g_, 8);
  KVVM_CUDA_ASSERT_OK(driver_->write(reversed, patch.data(), g_));  // = granule kGranules-1
  KVVM_CUDA_ASSIGN_OR_FAIL(actual, read(whole + (kGranules - 1) * g_, g_));
  EXPECT_TRUE(same_bytes(patch, actual));
}

TEST_F(CudaDriverTest, OneHandleMappedAtTwoAddressesSharesItsBytes) {
  Handle handle = kNoHandle;
  KVVM_CUDA_ASSIGN_OR_FAIL(handle, create(2 * g_));
  Address a = 0;
  Address b = 0;
  KVVM_CUDA_ASSIGN_OR_FAIL(a, reserve(2 * g_));
  KVVM_CUDA_ASSIGN_OR_FAIL(b, reserve(2 * g_));
  KVVM_CUDA_ASSERT_OK(map(a, 2 * g_, handle));
  KVVM_CUDA_ASSERT_OK(map(b, 2 * g_, handle));
  KVVM_CUDA_ASSERT_OK(driver_->set_access(a, 2 * g_, Access::kReadWrite));
  KVVM_CUDA_ASSERT_OK(driver_->set_access(b, 2 * g_, Access::kReadWrite));

  const Bytes first = random_bytes(2 * g_, 11);
  KVVM_CUDA_ASSERT_OK(driver_->write(a, first.data(), first.size()));
  Bytes actual;
  KVVM_CUDA_ASSIGN_OR_FAIL(actual, read(b, 2 * g_));
  EXPECT_TRUE(same_bytes(first, actual));

  const Bytes second = random_bytes(2 * g_, 12);
  KVVM_CUDA_ASSERT_OK(driver_->write(b, second.data(), second.size()));
  KVVM_CUDA_ASSIGN_OR_FAIL(actual, read(a, 2 * g_));
  EXPECT_TRUE(same_bytes(second, actual));

  // Read-only at one address, read-write at the other: the bytes are still shared.
  KVVM_CUDA_ASSERT_OK(driver_->set_access(b, 2 * g_, Access::kReadOnly));
  const Bytes third = random_bytes(2 * g_, 13);
  KVVM_CUDA_ASSERT_OK(driver_->write(a, third.data(), third.size()));
  KVVM_CUDA_ASSIGN_OR_FAIL(actual, read(b, 2 * g_));
  EXPECT_TRUE(same_bytes(third, actual));
}

// One cuMemSetAccess over two adjacent, separately mapped handles. NVIDIA's vectorAddMMAP
// sample does exactly this (one call over all of its stripes), so we expect it to work.
TEST_F(CudaDriverTest, SetAccessSpansTwoSeparatelyMappedHandles) {
  Address base = 0;
  KVVM_CUDA_ASSIGN_OR_FAIL(base, reserve(2 * g_));
  Handle first = kNoHandle;
  Handle second = kNoHandle;
  KVVM_CUDA_ASSIGN_OR_FAIL(first, create(g_));
  KVVM_CUDA_ASSIGN_OR_FAIL(second, create(g_));
  KVVM_CUDA_ASSERT_OK(map(base, g_, first));
  KVVM_CUDA_ASSERT_OK(map(base + g_, g_, second));

  const Status spanning = driver_->set_access(base, 2 * g_, Access::kReadWrite);
  say("cuda_set_access_over_two_mappings", spanning.to_string());
  EXPECT_TRUE(spanning.ok()) << spanning.to_string();
  if (!spanning.ok()) {  // go on with one call per mapping, to test the rest
    KVVM_CUDA_ASSERT_OK(driver_->set_access(base, g_, Access::kReadWrite));
    KVVM_CUDA_ASSERT_OK(driver_->set_access(base + g_, g_, Access::kReadWrite));
  }
  const Bytes pattern = random_bytes(2 * g_, 21);
  KVVM_CUDA_ASSERT_OK(driver_->write(base, pattern.data(), pattern.size()));
  Bytes actual;
  KVVM_CUDA_ASSIGN_OR_FAIL(actual, read(base, 2 * g_));
  EXPECT_TRUE(same_bytes(pattern, actual));

  // Both mappings turn read-only in one call: reads work, a write into either is refused.
  const Status read_only = driver_->set_access(base, 2 * g_, Access::kReadOnly);
  EXPECT_TRUE(read_only.ok()) << read_only.to_string();
  if (read_only.ok()) {
    KVVM_CUDA_ASSIGN_OR_FAIL(actual, read(base, 2 * g_));
    EXPECT_TRUE(same_bytes(pattern, actual));
    const Bytes byte(1, 0x5a);
    EXPECT_FALSE(driver_->write(base, byte.data(), 1).ok());
    EXPECT_FALSE(driver_->write(base + g_, byte.data(), 1).ok());
  }
}

// Access on part of one mapping. CUDA's documentation asks for "a fully mapped address range
// containing all allocations"; whether part of one mapping is allowed is not said, so this
// test only reports it (kvvm's layers change access per whole mapping).
TEST_F(CudaDriverTest, ReportsWhetherSetAccessAcceptsPartOfAMapping) {
  Address base = 0;
  KVVM_CUDA_ASSIGN_OR_FAIL(base, fresh_read_write(2 * g_));
  const Status partial = driver_->set_access(base + g_, g_, Access::kReadOnly);
  say("cuda_set_access_on_part_of_a_mapping", partial.to_string());
  if (partial.ok()) {
    const Bytes byte(1, 0x5a);
    EXPECT_TRUE(driver_->write(base, byte.data(), 1).ok()) << "first granule stayed writable";
    EXPECT_FALSE(driver_->write(base + g_, byte.data(), 1).ok()) << "second became read-only";
  }
  // Whatever the answer, the context still works.
  KVVM_CUDA_ASSERT_OK(driver_->synchronize());
}

// One cuMemUnmap over two adjacent, separately mapped handles. NVIDIA's vectorAddMMAP sample
// frees its stripes with one cuMemUnmap over the whole range, so we expect it to work.
TEST_F(CudaDriverTest, OneUnmapCoversTwoAdjacentMappings) {
  Address base = 0;
  KVVM_CUDA_ASSIGN_OR_FAIL(base, reserve(2 * g_));
  Handle first = kNoHandle;
  Handle second = kNoHandle;
  KVVM_CUDA_ASSIGN_OR_FAIL(first, create(g_));
  KVVM_CUDA_ASSIGN_OR_FAIL(second, create(g_));
  KVVM_CUDA_ASSERT_OK(map(base, g_, first));
  KVVM_CUDA_ASSERT_OK(map(base + g_, g_, second));
  KVVM_CUDA_ASSERT_OK(driver_->set_access(base, g_, Access::kReadWrite));
  KVVM_CUDA_ASSERT_OK(driver_->set_access(base + g_, g_, Access::kReadWrite));

  const Status coalesced = driver_->unmap(base, 2 * g_);
  say("cuda_unmap_over_two_mappings", coalesced.to_string());
  EXPECT_TRUE(coalesced.ok()) << coalesced.to_string();
  if (!coalesced.ok()) {
    KVVM_CUDA_ASSERT_OK(driver_->unmap(base, g_));
    KVVM_CUDA_ASSERT_OK(driver_->unmap(base + g_, g_));
  }
  // Both granules are free again: each handle maps there once more (swapped).
  KVVM_CUDA_ASSERT_OK(map(base, g_, second));
  KVVM_CUDA_ASSERT_OK(map(base + g_, g_, first));
  KVVM_CUDA_ASSERT_OK(driver_->unmap(base, g_));
  KVVM_CUDA_ASSERT_OK(driver_->unmap(base + g_, g_));
}

// CUDA documents that cuMemUnmap "cannot unmap a sub-range" of one mapping.
TEST_F(CudaDriverTest, UnmapOfPartOfAMappingIsRefused) {
  Address base = 0;
  KVVM_CUDA_ASSIGN_OR_FAIL(base, fresh_read_write(2 * g_));
  const Status partial = driver_->unmap(base + g_, g_);
  say("cuda_unmap_of_part_of_a_mapping", partial.to_string());
  EXPECT_FALSE(partial.ok());
  if (partial.ok()) {
    driver_->unmap(base, g_).ignore();  // what is left, so teardown can release and free
  } else {
    ASSERT_TRUE(partial.driver_failure().has_value()) << partial.to_string();
    EXPECT_EQ(partial.driver_failure()->call, "cuMemUnmap");
  }
}

}  // namespace
}  // namespace kvvm
