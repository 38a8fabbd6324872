// Host-only behaviour of the host driver; the shared behaviour is in the typed suites.
#include "kvvm/vmm/host_driver.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm {
namespace {

using testing::pattern;
using testing::read_maps;

std::unique_ptr<Driver> host(std::size_t granule = 0, std::size_t chunk_bytes = 0) {
  auto driver = make_host_driver({.granule = granule, .chunk_bytes = chunk_bytes});
  EXPECT_TRUE(driver.ok()) << driver.status().to_string();
  return driver.ok() ? std::move(driver).value() : nullptr;
}

constexpr std::size_t k2MiB = std::size_t{2} << 20;

TEST(HostDriver, GranuleIsThePageSizeOrAChosenMultiple) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(host()->granule(), page);
  EXPECT_EQ(host(2u << 20)->granularity().minimum, 2u << 20);
  auto bad = make_host_driver({.granule = page + 1});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(std::to_string(page)), std::string::npos);
  auto bad_chunk = make_host_driver({.granule = k2MiB, .chunk_bytes = 3u << 20});
  ASSERT_FALSE(bad_chunk.ok());
  EXPECT_EQ(bad_chunk.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_chunk.status().message().find(std::to_string(k2MiB)), std::string::npos);
}

TEST(HostDriver, InfoDescribesTheHost) {
  const DriverInfo info = host()->info();
  EXPECT_EQ(info.backend, "host");
  EXPECT_TRUE(info.vmm_supported);
  EXPECT_GT(info.total_bytes, 0u);
  EXPECT_FALSE(info.device_name.empty());
}

TEST(HostDriver, CountsTheTimeOfEveryCallByKind) {
  std::unique_ptr<Driver> driver = host();
  ASSERT_NE(driver, nullptr);
  const std::size_t granule = driver->granule();
  const auto start = std::chrono::steady_clock::now();
  Result<Address> base = driver->reserve(4 * granule);
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  Result<Handle> handle = driver->create(granule);
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  for (std::size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(driver->map(*base + i * granule, granule, *handle, 0).ok());
    ASSERT_TRUE(driver->set_access(*base + i * granule, granule, Access::kReadWrite).ok());
  }
  for (std::size_t i = 0; i < 4; ++i) ASSERT_TRUE(driver->unmap(*base + i * granule, granule).ok());
  ASSERT_TRUE(driver->release(*handle).ok());
  ASSERT_TRUE(driver->free(*base, 4 * granule).ok());
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const DriverCallCounts counts = driver->counts();
  double sum = 0;
  for (DriverOp op : {DriverOp::kReserve, DriverOp::kCreate, DriverOp::kMap, DriverOp::kSetAccess,
                      DriverOp::kUnmap, DriverOp::kRelease, DriverOp::kFree}) {
    // Every call is a system call (mmap, mprotect, munmap, memfd): never free.
    EXPECT_GT(counts.seconds(op), 0.0) << to_string(op);
    sum += counts.seconds(op);
  }
  // Only the calls' own time: within the caller's wall time around them all.
  EXPECT_LE(sum, wall);
  EXPECT_EQ(counts.seconds(DriverOp::kCopy), 0.0);  // no call of that kind
}

TEST(HostDriver, OneHandleAtTwoAddressesIsOneCopy) {
  auto driver = host();
  const std::size_t g = driver->granule();
  auto a = driver->reserve(2 * g);
  auto b = driver->reserve(2 * g);
  auto handle = driver->create(2 * g);
  ASSERT_TRUE(a.ok() && b.ok() && handle.ok());
  ASSERT_TRUE(driver->map(*a, 2 * g, *handle, 0).ok());
  ASSERT_TRUE(driver->set_access(*a, 2 * g, Access::kReadWrite).ok());
  // Only the second granule of the handle, at b's first window.
  ASSERT_TRUE(driver->map(*b, g, *handle, g).ok());
  ASSERT_TRUE(driver->set_access(*b, g, Access::kReadOnly).ok());
  const auto data = pattern(2 * g, testing::fresh_seed());
  ASSERT_TRUE(driver->write(*a, data.data(), data.size()).ok());
  std::vector<std::uint8_t> seen(g);
  ASSERT_TRUE(driver->read(seen.data(), *b, g).ok());
  EXPECT_EQ(0, std::memcmp(seen.data(), data.data() + g, g));
  const auto lines = read_maps(*b, *b + g);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].perms, "r--s");
  EXPECT_NE(lines[0].path.find("memfd:kvvm-handle"), std::string::npos);
  ASSERT_TRUE(driver->unmap(*b, g).ok());
  ASSERT_TRUE(driver->unmap(*a, 2 * g).ok());
  ASSERT_TRUE(driver->release(*handle).ok());
  ASSERT_TRUE(driver->free(*a, 2 * g).ok());
  ASSERT_TRUE(driver->free(*b, 2 * g).ok());
  EXPECT_EQ(host_driver_tables(*driver).handles, 0u);
}

TEST(HostDriver, RefusesWhatCudaRefuses) {
  auto driver = host();
  const std::size_t g = driver->granule();
  auto base = driver->reserve(4 * g);
  auto handle = driver->create(g);
  ASSERT_TRUE(base.ok() && handle.ok());
  EXPECT_FALSE(driver->map(*base + 1, g, *handle, 0).ok());      // unaligned
  EXPECT_FALSE(driver->map(*base, 2 * g, *handle, 0).ok());      // beyond the handle
  EXPECT_FALSE(driver->map(*base + 4 * g, g, *handle, 0).ok());  // outside the reservation
  EXPECT_FALSE(driver->map(*base, g, *handle + 1000, 0).ok());   // unknown handle
  ASSERT_TRUE(driver->map(*base, g, *handle, 0).ok());
  EXPECT_FALSE(driver->map(*base, g, *handle, 0).ok());  // over a mapping
  EXPECT_FALSE(driver->unmap(*base, 2 * g).ok());        // more than is mapped
  EXPECT_FALSE(driver->set_access(*base + g, g, Access::kReadWrite).ok());
  EXPECT_FALSE(driver->free(*base, 4 * g).ok());  // still mapped
  EXPECT_FALSE(driver->create(g + 1).ok());
  const auto failure = driver->create(0).status();
  EXPECT_EQ(failure.code(), StatusCode::kDriverError);
  ASSERT_TRUE(driver->unmap(*base, g).ok());
  EXPECT_FALSE(driver->unmap(*base, g).ok());  // twice
  ASSERT_TRUE(driver->release(*handle).ok());
  EXPECT_FALSE(driver->release(*handle).ok());  // twice
  ASSERT_TRUE(driver->free(*base, 4 * g).ok());
}

TEST(HostDriver, CreateAllocatesForReal) {
  auto driver = host();
  const std::size_t g = driver->granule();
  auto handle = driver->create(64 * g);
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(host_driver_tables(*driver).handle_bytes, 64 * g);
  ASSERT_TRUE(driver->release(*handle).ok());
}

TEST(HostDriverDeathTest, WriteThroughReadOnlyMappingFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto driver = host();
  const std::size_t g = driver->granule();
  auto base = driver->reserve(g);
  auto handle = driver->create(g);
  ASSERT_TRUE(base.ok() && handle.ok());
  ASSERT_TRUE(driver->map(*base, g, *handle, 0).ok());
  ASSERT_TRUE(driver->set_access(*base, g, Access::kReadOnly).ok());
  auto* bytes = reinterpret_cast<volatile std::uint8_t*>(*base);
  EXPECT_EQ(bytes[0], 0u);  // reading is allowed
  EXPECT_DEATH({ bytes[0] = 1; }, "");
  ASSERT_TRUE(driver->unmap(*base, g).ok());
  ASSERT_TRUE(driver->release(*handle).ok());
  ASSERT_TRUE(driver->free(*base, g).ok());
}

}  // namespace
}  // namespace kvvm
