// Tests of the CUDA driver (src/vmm/cuda_driver.cc).
//
// Without a usable GPU every test that needs one is skipped, with the reason; the tests of
// what make_cuda_driver says when there is no device run everywhere.
//
// Where CUDA's documentation leaves a behaviour open (one cuMemSetAccess or cuMemUnmap over
// several mappings, access changes on part of a mapping, what a copy into a read-only
// mapping does) the test states what we expect and prints what CUDA did, as a line starting
// with "[ CUDA ]", so one run on a GPU tells the truth. Anything that may fault the device
// runs in a child process (a death test, "threadsafe" style: the binary is re-executed), so a
// poisoned context cannot take the rest of the suite with it.
#include "kvvm/cuda_driver.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

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

#include "vmm/cuda_api.h"

#define KVVM_CUDA_CONCAT_INNER(a, b) a##b
#define KVVM_CUDA_CONCAT(a, b) KVVM_CUDA_CONCAT_INNER(a, b)

// Fails the test (fatally) with the status text when `expr` is not OK.
#define KVVM_CUDA_ASSERT_OK(expr)                                                          \
  do {                                                                                     \
    const ::kvvm::Status kvvm_cuda_status_ = (expr);                                       \
    ASSERT_TRUE(kvvm_cuda_status_.ok()) << #expr << ": " << kvvm_cuda_status_.to_string(); \
  } while (0)

// `lhs = value of expr`, or a fatal failure with the status text.
#define KVVM_CUDA_ASSIGN_OR_FAIL(lhs, expr)                                                   \
  auto KVVM_CUDA_CONCAT(kvvm_cuda_result_, __LINE__) = (expr);                                \
  ASSERT_TRUE(KVVM_CUDA_CONCAT(kvvm_cuda_result_, __LINE__).ok())                             \
      << #expr << ": " << KVVM_CUDA_CONCAT(kvvm_cuda_result_, __LINE__).status().to_string(); \
  lhs = std::move(KVVM_CUDA_CONCAT(kvvm_cuda_result_, __LINE__)).value()

namespace kvvm {
namespace {

using Bytes = std::vector<unsigned char>;

std::string unavailable_reason() {
  auto driver = make_cuda_driver();
  return driver.ok() ? std::string("available") : driver.status().to_string();
}

// What CUDA did, for the log of a GPU run (and the XML report through RecordProperty, hence
// a key that is a valid XML attribute name).
void say(const std::string& key, const std::string& line) {
  std::cout << "[ CUDA ] " << key << ": " << line << std::endl;
  ::testing::Test::RecordProperty(key, line);
}

Bytes random_bytes(std::size_t bytes, std::uint64_t seed) {
  Bytes out(bytes);
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < bytes; i += 8) {
    const std::uint64_t word = rng();
    std::memcpy(out.data() + i, &word, std::min<std::size_t>(8, bytes - i));
  }
  return out;
}

::testing::AssertionResult same_bytes(const Bytes& expected, const Bytes& actual) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << expected.size() << " vs " << actual.size();
  }
  auto [e, a] = std::mismatch(expected.begin(), expected.end(), actual.begin());
  if (e == expected.end()) return ::testing::AssertionSuccess();
  const auto index = static_cast<std::size_t>(e - expected.begin());
  std::size_t differing = 0;
  for (std::size_t i = index; i < expected.size(); ++i) differing += expected[i] != actual[i];
  return ::testing::AssertionFailure()
         << "first difference at byte " << index << " of " << expected.size() << " (expected "
         << int{expected[index]} << ", got " << int{actual[index]} << "); " << differing
         << " bytes differ";
}

// ---------------------------------------------------------------------------------------
// Without a GPU (these run everywhere).

TEST(CudaDriverAvailabilityTest, MakeAgreesWithAvailabilityAndSaysWhyNot) {
  auto driver = make_cuda_driver();
  if (cuda_available()) {
    // A device exists; only one without virtual memory management support is refused.
    EXPECT_TRUE(driver.ok() ||
                driver.status().message().find("virtual memory management") != std::string::npos)
        << "cuda_available() but " << driver.status().to_string();
    return;
  }
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), StatusCode::kUnavailable) << driver.status().to_string();
  EXPECT_FALSE(driver.status().driver_failure().has_value());
  EXPECT_FALSE(driver.status().message().empty());
#ifdef KVVM_HAS_CUDA
  // No libcuda, no device, or a device without VMM: each message names which.
  const Status status = driver.status();
  const std::string& message = status.message();
  EXPECT_TRUE(message.find("CUDA driver library") != std::string::npos ||
              message.find("cuInit") != std::string::npos ||
              message.find("device") != std::string::npos ||
              message.find("libcuda") != std::string::npos)
      << message;
  EXPECT_FALSE(detail::cuda_load_error().empty());
#else
  EXPECT_NE(driver.status().message().find("built without CUDA"), std::string::npos)
      << driver.status().message();
#endif
  std::cout << "make_cuda_driver without a usable GPU: " << driver.status().to_string()
            << std::endl;
}

TEST(CudaDriverAvailabilityTest, AvailabilityIsStable) {
  const bool first = cuda_available();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cuda_available(), first);
}

TEST(CudaDriverAvailabilityTest, NonexistentDeviceIsUnavailable) {
  for (int ordinal : {-1, 4096}) {
    SCOPED_TRACE("device " + std::to_string(ordinal));
    auto driver = make_cuda_driver({.device = ordinal});
    ASSERT_FALSE(driver.ok());
    EXPECT_EQ(driver.status().code(), StatusCode::kUnavailable) << driver.status().to_string();
    if (cuda_available()) {
      EXPECT_NE(driver.status().message().find("device " + std::to_string(ordinal) + " of "),
                std::string::npos)
          << driver.status().message();
      EXPECT_NE(driver.status().message().find("does not exist"), std::string::npos);
    }
  }
}

TEST(CudaDriverAvailabilityTest, RawProbeWithoutDeviceReportsInsteadOfCrashing) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (the GPU tests cover the probe)";
  unsigned char byte = 0;
  const detail::CudaRawCopyProbe probe = detail::cuda_raw_write_probe(0, 0x1000, &byte, 1);
  EXPECT_FALSE(probe.copy.ok());
  EXPECT_FALSE(probe.copy.name.empty());
}

// ---------------------------------------------------------------------------------------
// With a GPU.

class CudaDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no usable CUDA device: " << unavailable_reason();
    auto driver = make_cuda_driver();
    if (!driver.ok() && driver.status().code() == StatusCode::kUnavailable) {
      GTEST_SKIP() << "CUDA device 0 is not usable: " << driver.status().to_string();
    }
    ASSERT_TRUE(driver.ok()) << driver.status().to_string();
    driver_ = std::move(driver).value();
    g_ = driver_->granule();
    ASSERT_GT(g_, 0u);
  }

  void TearDown() override {
    // Undo in reverse; steps that no longer apply (already unmapped by the test) just fail.
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) (*it)();
    undo_.clear();
    driver_.reset();
  }

  // The driver calls, with the undo recorded on success so a failing test leaks nothing.
  Result<Address> reserve(std::size_t bytes) {
    Result<Address> address = driver_->reserve(bytes);
    if (address.ok()) {
      undo_.push_back([this, a = *address, bytes] { driver_->free(a, bytes).ignore(); });
    }
    return address;
  }
  Result<Handle> create(std::size_t bytes) {
    Result<Handle> handle = driver_->create(bytes);
    if (handle.ok()) undo_.push_back([this, h = *handle] { driver_->release(h).ignore(); });
    return handle;
  }
  Status map(Address address, std::size_t bytes, Handle handle, std::size_t offset = 0) {
    Status status = driver_->map(address, bytes, handle, offset);
    if (status.ok()) {
      undo_.push_back([this, address, bytes] { driver_->unmap(address, bytes).ignore(); });
    }
    return status;
  }
  // reserve + create + map + read-write access of `bytes` at a fresh address.
  Result<Address> fresh_read_write(std::size_t bytes) {
    Result<Address> address = reserve(bytes);
    if (!address.ok()) return address;
    Result<Handle> handle = create(bytes);
    if (!handle.ok()) return handle.status();
    KVVM_RETURN_IF_ERROR(map(*address, bytes, *handle));
    KVVM_RETURN_IF_ERROR(driver_->set_access(*address, bytes, Access::kReadWrite));
    return address;
  }
  Result<Bytes> read(Address address, std::size_t bytes) {
    Bytes out(bytes);
    KVVM_RETURN_IF_ERROR(driver_->read(out.data(), address, bytes));
    return out;
  }

  std::unique_ptr<Driver> driver_;
  std::size_t g_ = 0;
  std::vector<std::function<void()>> undo_;
};

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

// ---------------------------------------------------------------------------------------
// Copies into read-only mappings, each in a child process.

struct ChildOutcome {
  int exit_code = -1;  // -1: killed by a signal
  std::string stderr_text;
  std::string report() const {  // the child's "kvvm-probe:" line
    const auto at = stderr_text.find("kvvm-probe: ");
    if (at == std::string::npos) return "(no report; stderr: " + stderr_text + ")";
    const auto end = stderr_text.find('\n', at);
    return stderr_text.substr(at + 12, end == std::string::npos ? end : end - at - 12);
  }
};

// Keeps the child's stderr for the parent; matches anything.
class CaptureText : public ::testing::MatcherInterface<const std::string&> {
 public:
  explicit CaptureText(std::string* out) : out_(out) {}
  bool MatchAndExplain(const std::string& text, ::testing::MatchResultListener*) const override {
    *out_ = text;
    return true;
  }
  void DescribeTo(std::ostream* os) const override { *os << "anything (kept for the report)"; }

 private:
  std::string* out_;
};

void child_report(const std::string& line) {
  std::fprintf(stderr, "kvvm-probe: %s\n", line.c_str());
  std::fflush(stderr);
}

// Runs `body` in a re-executed copy of this binary; its return value is the exit code.
ChildOutcome run_in_child(const std::function<int()>& body) {
  ChildOutcome outcome;
  const std::string saved_style = GTEST_FLAG_GET(death_test_style);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [&body] {
    std::fflush(stdout);
    const int code = body();
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  };
  auto exited = [&outcome](int status) {
    outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return true;
  };
  EXPECT_EXIT(run(), exited,
              ::testing::Matcher<const std::string&>(new CaptureText(&outcome.stderr_text)));
  GTEST_FLAG_SET(death_test_style, saved_style);
  return outcome;
}

// In the child: a 2-granule read-only mapping holding `pattern`, or a report and exit code 3.
struct ReadOnlySetup {
  std::unique_ptr<Driver> driver;
  Address base = 0;
  std::size_t bytes = 0;
  Bytes pattern;
};
bool set_up_read_only(ReadOnlySetup& setup) {
  auto made = make_cuda_driver();
  if (!made.ok()) {
    child_report("setup: " + made.status().to_string());
    return false;
  }
  setup.driver = std::move(made).value();
  Driver& d = *setup.driver;
  setup.bytes = 2 * d.granule();
  setup.pattern = random_bytes(setup.bytes, 51);
  auto base = d.reserve(setup.bytes);
  auto handle = d.create(setup.bytes);
  if (!base.ok() || !handle.ok()) {
    child_report("setup: " + base.status().to_string() + " " + handle.status().to_string());
    return false;
  }
  setup.base = *base;
  for (const Status& status : {d.map(setup.base, setup.bytes, *handle, 0),
                               d.set_access(setup.base, setup.bytes, Access::kReadWrite),
                               d.write(setup.base, setup.pattern.data(), setup.bytes),
                               d.set_access(setup.base, setup.bytes, Access::kReadOnly)}) {
    if (!status.ok()) {
      child_report("setup: " + status.to_string());
      return false;
    }
  }
  return true;
}

// After a refused or faulting copy: does a fresh read-write map + write + read still work?
Status fresh_round_trip(Driver& d) {
  const std::size_t g = d.granule();
  auto base = d.reserve(g);
  if (!base.ok()) return base.status();
  auto handle = d.create(g);
  if (!handle.ok()) return handle.status();
  KVVM_RETURN_IF_ERROR(d.map(*base, g, *handle, 0));
  KVVM_RETURN_IF_ERROR(d.set_access(*base, g, Access::kReadWrite));
  const Bytes pattern = random_bytes(g, 52);
  KVVM_RETURN_IF_ERROR(d.write(*base, pattern.data(), g));
  Bytes actual(g);
  KVVM_RETURN_IF_ERROR(d.read(actual.data(), *base, g));
  if (actual != pattern) return Status::Internal("fresh round trip read back other bytes");
  return Status::Ok();
}

std::string unchanged_text(Driver& d, const ReadOnlySetup& setup) {
  Bytes actual(setup.bytes);
  const Status status = d.read(actual.data(), setup.base, setup.bytes);
  if (!status.ok()) return "unknown (read failed: " + status.to_string() + ")";
  return actual == setup.pattern ? "yes" : "NO";
}

TEST_F(CudaDriverTest, WriteIntoReadOnlyMappingFailsAndTheContextKeepsWorking) {
  const ChildOutcome outcome = run_in_child([] {
    ReadOnlySetup setup;
    if (!set_up_read_only(setup)) return 3;
    Driver& d = *setup.driver;
    const std::size_t g = d.granule();
    // Unaligned, over both granules of the read-only mapping.
    const Bytes other = random_bytes(g, 53);
    const Status write = d.write(setup.base + g / 2, other.data(), g);
    const std::string unchanged = unchanged_text(d, setup);
    const Status sync = d.synchronize();
    const Status fresh = fresh_round_trip(d);
    const auto refused = d.counts().failed(DriverOp::kCopy);
    child_report("Driver::write into a read-only mapping: " + write.to_string() +
                 "; bytes unchanged: " + unchanged + "; then synchronize: " + sync.to_string() +
                 "; fresh map+write+read: " + fresh.to_string() +
                 "; failed copies counted: " + std::to_string(refused));
    return !write.ok() && unchanged == "yes" && sync.ok() && fresh.ok() && refused == 1 ? 0 : 1;
  });
  say("cuda_driver_write_into_read_only", outcome.report());
  EXPECT_EQ(outcome.exit_code, 0) << outcome.stderr_text;
}

// What CUDA itself does with that copy (kvvm refuses it before CUDA sees it). Documentation
// only: passes whatever CUDA does, as long as the child ran; the answer is in the log.
TEST_F(CudaDriverTest, ReportsWhatARawCopyIntoAReadOnlyMappingDoes) {
  const ChildOutcome outcome = run_in_child([] {
    ReadOnlySetup setup;
    if (!set_up_read_only(setup)) return 3;
    Driver& d = *setup.driver;
    const Bytes other = random_bytes(d.granule(), 54);
    const detail::CudaRawCopyProbe probe =
        detail::cuda_raw_write_probe(0, setup.base, other.data(), other.size());
    const Status sync = d.synchronize();
    const std::string unchanged = unchanged_text(d, setup);
    const Status fresh = fresh_round_trip(d);
    child_report("raw cuMemcpyHtoD into a PROT_READ mapping returned " + probe.copy.name +
                 ", then cuStreamSynchronize " + probe.stream_sync.name + ", cuCtxSynchronize " +
                 probe.ctx_sync.name + "; afterwards synchronize: " + sync.to_string() +
                 "; bytes unchanged: " + unchanged +
                 "; fresh map+write+read: " + fresh.to_string());
    return 0;
  });
  say("cuda_raw_copy_into_read_only", outcome.report());
  EXPECT_EQ(outcome.exit_code, 0) << outcome.stderr_text;
}

}  // namespace
}  // namespace kvvm
