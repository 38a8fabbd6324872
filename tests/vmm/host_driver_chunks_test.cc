// The host driver keeps handles as ranges of a few chunked memory files: what that must not
// change (one copy per handle, memory back on release, CUDA's release-while-mapped) and what
// it buys (more handles than the descriptor limit has files).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kvvm/vmm/host_driver.h"
#include "support/pattern.h"

namespace kvvm::host_driver_chunks_test {
namespace {

using testing::pattern;

constexpr std::size_t k2MiB = std::size_t{2} << 20;

std::unique_ptr<Driver> host(std::size_t granule, std::size_t chunk_bytes) {
  auto driver = make_host_driver({.granule = granule, .chunk_bytes = chunk_bytes});
  EXPECT_TRUE(driver.ok()) << driver.status().to_string();
  return driver.ok() ? std::move(driver).value() : nullptr;
}

std::size_t page_size() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

// Lowers the soft descriptor limit for one scope and puts it back after.
class DescriptorLimit {
 public:
  explicit DescriptorLimit(rlim_t soft) {
    EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &saved_), 0);
    rlimit lowered = saved_;
    lowered.rlim_cur = soft;
    EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  }
  ~DescriptorLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }
  DescriptorLimit(const DescriptorLimit&) = delete;
  DescriptorLimit& operator=(const DescriptorLimit&) = delete;

  static rlim_t soft() {
    rlimit now{};
    getrlimit(RLIMIT_NOFILE, &now);
    return now.rlim_cur;
  }

 private:
  rlimit saved_{};
};

TEST(HostDriverChunks, CommitsMoreHandlesThanTheDescriptorLimitHasFiles) {
  constexpr rlim_t kLimit = 64;
  constexpr std::size_t kHandles = 3 * kLimit;
  DescriptorLimit limit(kLimit);
  const std::size_t g = page_size();
  auto driver = host(g, 16 * g);  // small chunks: several files, still far fewer than handles
  ASSERT_EQ(DescriptorLimit::soft(), kLimit);  // nobody raised it behind the test's back
  auto a = driver->reserve(kHandles * g);
  auto b = driver->reserve(kHandles * g);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<Handle> handles;
  for (std::size_t i = 0; i < kHandles; ++i) {
    auto handle = driver->create(g);
    ASSERT_TRUE(handle.ok()) << "handle " << i << ": " << handle.status().to_string();
    handles.push_back(*handle);
    // Reverse order at b: neighbouring windows map different files or far-apart ranges.
    ASSERT_TRUE(driver->map(*a + i * g, g, *handle, 0).ok());
    ASSERT_TRUE(driver->map(*b + (kHandles - 1 - i) * g, g, *handle, 0).ok());
  }
  EXPECT_EQ(host_driver_tables(*driver).files, kHandles / 16);
  ASSERT_TRUE(driver->set_access(*a, kHandles * g, Access::kReadWrite).ok());
  ASSERT_TRUE(driver->set_access(*b, kHandles * g, Access::kReadOnly).ok());
  const auto data = pattern(kHandles * g, testing::fresh_seed());
  ASSERT_TRUE(driver->write(*a, data.data(), data.size()).ok());
  std::vector<std::uint8_t> seen(g);
  for (std::size_t i = 0; i < kHandles; ++i) {
    ASSERT_TRUE(driver->read(seen.data(), *b + (kHandles - 1 - i) * g, g).ok());
    ASSERT_EQ(0, std::memcmp(seen.data(), data.data() + i * g, g)) << "handle " << i;
  }
  ASSERT_TRUE(driver->unmap(*a, kHandles * g).ok());
  ASSERT_TRUE(driver->unmap(*b, kHandles * g).ok());
  for (Handle handle : handles) ASSERT_TRUE(driver->release(handle).ok());
  ASSERT_TRUE(driver->free(*a, kHandles * g).ok());
  ASSERT_TRUE(driver->free(*b, kHandles * g).ok());
  EXPECT_EQ(host_driver_tables(*driver).files, 0u);
}

TEST(HostDriverChunks, ReleasedHandlesGiveTheirMemoryBack) {
  // 2 MiB: a punched range is whole huge pages too, where the kernel backs shmem with them.
  const std::size_t g = k2MiB;
  auto driver = host(g, 4 * g);
  auto base = driver->reserve(g);
  auto first = driver->create(g);
  auto second = driver->create(g);
  ASSERT_TRUE(base.ok() && first.ok() && second.ok());
  HostDriverTables tables = host_driver_tables(*driver);
  EXPECT_EQ(tables.files, 1u);  // both in one chunk
  EXPECT_EQ(tables.resident_bytes, 2 * g);
  ASSERT_TRUE(driver->map(*base, g, *first, 0).ok());
  ASSERT_TRUE(driver->set_access(*base, g, Access::kReadWrite).ok());
  const auto data = pattern(g, testing::fresh_seed());
  ASSERT_TRUE(driver->write(*base, data.data(), g).ok());
  ASSERT_TRUE(driver->unmap(*base, g).ok());
  ASSERT_TRUE(driver->release(*first).ok());
  tables = host_driver_tables(*driver);
  EXPECT_EQ(tables.files, 1u);  // the second handle still lives in it
  EXPECT_EQ(tables.resident_bytes, g);

  // The next handle takes the freed range back: it must not see the old bytes.
  auto third = driver->create(g);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(host_driver_tables(*driver).files, 1u);
  ASSERT_TRUE(driver->map(*base, g, *third, 0).ok());
  ASSERT_TRUE(driver->set_access(*base, g, Access::kReadOnly).ok());
  std::vector<std::uint8_t> seen(g, 0xff);
  ASSERT_TRUE(driver->read(seen.data(), *base, g).ok());
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), static_cast<std::ptrdiff_t>(g));
  ASSERT_TRUE(driver->unmap(*base, g).ok());
  ASSERT_TRUE(driver->release(*third).ok());
  ASSERT_TRUE(driver->release(*second).ok());
  tables = host_driver_tables(*driver);
  EXPECT_EQ(tables.files, 0u);  // no handle lives in the chunk: its descriptor is closed
  EXPECT_EQ(tables.resident_bytes, 0u);
  ASSERT_TRUE(driver->free(*base, g).ok());
}

TEST(HostDriverChunks, FilesOpenWhenTheOthersAreFullAndCloseWhenEmpty) {
  const std::size_t g = page_size();
  auto driver = host(g, 2 * g);
  std::vector<Handle> small;
  for (int i = 0; i < 5; ++i) {
    auto handle = driver->create(g);
    ASSERT_TRUE(handle.ok());
    small.push_back(*handle);
  }
  EXPECT_EQ(host_driver_tables(*driver).files, 3u);  // two, two and one of five
  auto large = driver->create(5 * g);                // larger than a chunk: a file of its own
  ASSERT_TRUE(large.ok());
  EXPECT_EQ(host_driver_tables(*driver).files, 4u);
  auto fits = driver->create(g);  // the third file's free half, not a new file
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(host_driver_tables(*driver).files, 4u);
  ASSERT_TRUE(driver->release(small[0]).ok());
  EXPECT_EQ(host_driver_tables(*driver).files, 4u);
  ASSERT_TRUE(driver->release(small[1]).ok());
  EXPECT_EQ(host_driver_tables(*driver).files, 3u);
  ASSERT_TRUE(driver->release(*large).ok());
  EXPECT_EQ(host_driver_tables(*driver).files, 2u);
  for (std::size_t i = 2; i < small.size(); ++i) ASSERT_TRUE(driver->release(small[i]).ok());
  EXPECT_EQ(host_driver_tables(*driver).files, 1u);
  ASSERT_TRUE(driver->release(*fits).ok());
  EXPECT_EQ(host_driver_tables(*driver).files, 0u);
  EXPECT_EQ(host_driver_tables(*driver).handles, 0u);
}

TEST(HostDriverChunks, AHandleReleasedWhileMappedKeepsItsBytesUntilUnmapped) {
  const std::size_t g = page_size();
  auto driver = host(g, 4 * g);
  auto a = driver->reserve(g);
  auto b = driver->reserve(2 * g);
  auto handle = driver->create(g);
  ASSERT_TRUE(a.ok() && b.ok() && handle.ok());
  ASSERT_TRUE(driver->map(*a, g, *handle, 0).ok());
  ASSERT_TRUE(driver->map(*b, g, *handle, 0).ok());
  ASSERT_TRUE(driver->set_access(*a, g, Access::kReadWrite).ok());
  const auto data = pattern(g, testing::fresh_seed());
  ASSERT_TRUE(driver->write(*a, data.data(), g).ok());
  ASSERT_TRUE(driver->release(*handle).ok());
  EXPECT_FALSE(driver->release(*handle).ok());            // unknown from now on
  EXPECT_FALSE(driver->map(*b + g, g, *handle, 0).ok());  // likewise
  EXPECT_EQ(host_driver_tables(*driver).handles, 0u);
  // A new handle must get other bytes while the released one is still mapped.
  auto other = driver->create(g);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(driver->map(*b + g, g, *other, 0).ok());
  ASSERT_TRUE(driver->set_access(*b + g, g, Access::kReadWrite).ok());
  const auto other_data = pattern(g, testing::fresh_seed());
  ASSERT_TRUE(driver->write(*b + g, other_data.data(), g).ok());
  std::vector<std::uint8_t> seen(g);
  ASSERT_TRUE(driver->read(seen.data(), *a, g).ok());
  EXPECT_EQ(seen, data);
  ASSERT_TRUE(driver->unmap(*a, g).ok());
  ASSERT_TRUE(driver->set_access(*b, g, Access::kReadOnly).ok());
  ASSERT_TRUE(driver->read(seen.data(), *b, g).ok());  // the last mapping still has them
  EXPECT_EQ(seen, data);
  EXPECT_EQ(host_driver_tables(*driver).resident_bytes, 2 * g);
  ASSERT_TRUE(driver->unmap(*b, 2 * g).ok());  // the last mapping: now the bytes go
  EXPECT_EQ(host_driver_tables(*driver).resident_bytes, g);
  ASSERT_TRUE(driver->release(*other).ok());
  EXPECT_EQ(host_driver_tables(*driver).files, 0u);
  ASSERT_TRUE(driver->free(*a, g).ok());
  ASSERT_TRUE(driver->free(*b, 2 * g).ok());
}

}  // namespace
}  // namespace kvvm::host_driver_chunks_test
