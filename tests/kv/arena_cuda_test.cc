// Arena behaviour that needs a real GPU kernel: a release is stream-ordered, so windows a
// running kernel reads are not unmapped until the fence recorded after it completes.
// Skipped (and reported skipped) without a GPU or without the CUDA compiler.
#include <gtest/gtest.h>

#include "kvvm/kv/arena.h"
#include "kvvm/vmm/cuda_driver.h"
#include "support/invariants.h"
#include "support/pattern.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include "kernels/spin_reader.h"
#endif

namespace kvvm {
namespace {

TEST(ArenaCudaTest, ReleaseNeverUnmapsBeforeTheFenceAfterItsLastReaderCompletes) {
#if !defined(KVVM_HAS_CUDA_KERNELS)
  GTEST_SKIP() << "built without the CUDA compiler: no kernel to read the slot";
#else
  auto made = make_cuda_driver();
  if (!made.ok()) GTEST_SKIP() << "no CUDA device: " << made.status().to_string();
  std::unique_ptr<Driver> driver = std::move(made).value();
  const std::size_t g = driver->granule();
  Governor governor;
  const TierId tier = governor.add_tier("gpu", 64 * g);
  {
    HandlePool pool(*driver, PoolOptions{.max_pooled_bytes = 0}, &governor, tier);
    auto plan =
        plan_layout(Geometry{"test", 2, 2, 64, DType::kFp16}, Layout::kTokenMajor, g, 4 * g / 1024);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    auto arena = Arena::create(pool, governor, ArenaOptions{*plan, 2, tier, 0, {}});
    ASSERT_TRUE(arena.ok()) << arena.status().to_string();
    auto slot = (*arena)->admit(2 * g / 1024);  // two windows
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    const auto data = testing::pattern(2 * g, testing::fresh_seed());
    ASSERT_TRUE(driver->write((*arena)->slot_base(*slot), data.data(), data.size()).ok());

    auto stream = kernels::create_stream();
    ASSERT_TRUE(stream.ok()) << stream.status().to_string();
    // A kernel reads both windows for 300 ms; the sequence finishes while it runs.
    ASSERT_TRUE(
        kernels::launch_spin_reader(*stream, (*arena)->slot_base(*slot), 2 * g, 300000, 0).ok());
    ASSERT_TRUE((*arena)->finish(*slot, *stream).ok());
    const auto unmaps = driver->counts().of(DriverOp::kUnmap);
    EXPECT_EQ((*arena)->reclaim(UINT64_MAX), 0u) << "the kernel still reads these windows";
    EXPECT_EQ(driver->counts().of(DriverOp::kUnmap), unmaps);
    EXPECT_EQ((*arena)->stats().committed_bytes, 2 * g);
    // Once the kernel is done, the same call unmaps and gives the bytes back.
    Status synchronized = kernels::synchronize_stream(*stream);
    ASSERT_TRUE(synchronized.ok()) << synchronized.to_string() << " (the kernel faulted?)";
    EXPECT_EQ((*arena)->reclaim(UINT64_MAX), 2 * g);
    EXPECT_EQ((*arena)->stats().committed_bytes, 0u);
    EXPECT_EQ(governor.stats(tier).used, 0u);
    kernels::destroy_stream(*stream);
    testing::World world{driver.get(), driver.get(), &pool,
                         &governor,    tier,         (*arena)->reservations()};
    EXPECT_EQ(testing::check_invariants(world), "");
  }
#endif
}

}  // namespace
}  // namespace kvvm
