// Reservation behaviour on every backend: growth without moving, release keeping addresses,
// sharing one handle, teardown, and refusal of bad input with nothing changed.
#include "kvvm/vmm/reservation.h"

#include <gtest/gtest.h>

#include <cstring>

#include "support/pattern.h"
#include "support/world_fixture.h"

namespace kvvm {
namespace {

using testing::pattern;

template <typename Backend>
class ReservationTest : public testing::WorldTest<Backend> {
 protected:
  std::vector<std::uint8_t> read(const Reservation& reservation, std::size_t offset,
                                 std::size_t bytes) {
    std::vector<std::uint8_t> data(bytes);
    Status status = this->driver_->read(data.data(), reservation.base() + offset, bytes);
    EXPECT_TRUE(status.ok()) << status.to_string();
    return data;
  }
  void write(const Reservation& reservation, std::size_t offset,
             const std::vector<std::uint8_t>& data) {
    Status status = this->driver_->write(reservation.base() + offset, data.data(), data.size());
    ASSERT_TRUE(status.ok()) << status.to_string();
  }
};
TYPED_TEST_SUITE(ReservationTest, testing::AllBackends, testing::BackendNames);

TYPED_TEST(ReservationTest, CommitsOfEverySizeAndHandleSizeHoldTheirBytes) {
  const std::size_t g = this->g_;
  for (std::size_t granules : {1u, 2u, 5u, 64u}) {
    for (std::size_t per_handle : {std::size_t{1}, std::size_t{2}, granules}) {
      SCOPED_TRACE("granules " + std::to_string(granules) + ", per handle " +
                   std::to_string(per_handle));
      Reservation& reservation = this->reserve(granules);
      const auto before = this->driver_->counts();
      ASSERT_TRUE(this->commit(reservation, 0, granules, {.handle_bytes = per_handle * g}).ok());
      const auto after = this->driver_->counts();
      const std::size_t handles = (granules + per_handle - 1) / per_handle;
      EXPECT_EQ(reservation.blocks().size(), handles);
      EXPECT_EQ(after.of(DriverOp::kMap) - before.of(DriverOp::kMap), handles);
      EXPECT_EQ(after.of(DriverOp::kSetAccess) - before.of(DriverOp::kSetAccess), 1u);
      const auto data = pattern(granules * g, testing::fresh_seed());
      this->write(reservation, 0, data);
      EXPECT_EQ(this->read(reservation, 0, granules * g), data);
      this->expect_invariants();
      this->reservations_.clear();
      this->expect_invariants();
    }
  }
}

TYPED_TEST(ReservationTest, GrowthMapsAfterWhatIsMappedAndNeverMoves) {
  const std::size_t g = this->g_;
  constexpr std::size_t kWindows = 24;
  Reservation& reservation = this->reserve(kWindows);
  const Address base = reservation.base();
  std::vector<std::vector<std::uint8_t>> written;
  const auto before = this->driver_->counts();
  for (std::size_t w = 0; w < kWindows; ++w) {
    ASSERT_TRUE(this->commit(reservation, w, 1).ok());
    written.push_back(pattern(g, testing::fresh_seed()));
    this->write(reservation, w * g, written.back());
    ASSERT_EQ(reservation.base(), base);
  }
  const auto after = this->driver_->counts();
  // Growth is create + map + set_access per window: no reserve, no unmap, no release.
  EXPECT_EQ(after.of(DriverOp::kCreate) - before.of(DriverOp::kCreate), kWindows);
  EXPECT_EQ(after.of(DriverOp::kMap) - before.of(DriverOp::kMap), kWindows);
  EXPECT_EQ(after.of(DriverOp::kSetAccess) - before.of(DriverOp::kSetAccess), kWindows);
  EXPECT_EQ(after.of(DriverOp::kReserve), before.of(DriverOp::kReserve));
  EXPECT_EQ(after.of(DriverOp::kUnmap), before.of(DriverOp::kUnmap));
  EXPECT_EQ(after.of(DriverOp::kRelease), before.of(DriverOp::kRelease));
  for (std::size_t w = 0; w < kWindows; ++w) {
    EXPECT_EQ(this->read(reservation, w * g, g), written[w]) << "window " << w;
  }
  EXPECT_EQ(reservation.mapped_bytes(), kWindows * g);
  EXPECT_EQ(this->governor_.stats(this->tier_).used, kWindows * g);
  this->expect_invariants();
}

TYPED_TEST(ReservationTest, ReleaseCoalescesKeepsAddressesAndThePoolMakesRecommitCheap) {
  const std::size_t g = this->g_;
  Reservation& reservation = this->reserve(8);
  ASSERT_TRUE(this->commit(reservation, 1, 5).ok());
  const auto before = this->driver_->counts();
  ASSERT_TRUE(reservation.release(g, 5 * g).ok());
  const auto released = this->driver_->counts();
  EXPECT_EQ(released.of(DriverOp::kUnmap) - before.of(DriverOp::kUnmap), 1u) << "coalesced";
  EXPECT_EQ(released.of(DriverOp::kRelease), before.of(DriverOp::kRelease)) << "pooled";
  EXPECT_EQ(this->pool_->snapshot().pooled_bytes, 5 * g);
  EXPECT_EQ(reservation.mapped_bytes(), 0u);
  this->expect_invariants();

  const auto hits = this->pool_->snapshot().pool_hits;
  ASSERT_TRUE(this->commit(reservation, 1, 5).ok());
  const auto recommitted = this->driver_->counts();
  EXPECT_EQ(recommitted.of(DriverOp::kCreate), released.of(DriverOp::kCreate)) << "no create";
  EXPECT_EQ(this->pool_->snapshot().pool_hits, hits + 5);
  EXPECT_EQ(this->governor_.stats(this->tier_).used, 5 * g) << "pooled bytes charged once";
  this->expect_invariants();
}

TYPED_TEST(ReservationTest, SharedHandleIsOneCopyBilledOnceAndLivesAsLongAsItsLastMapping) {
  const std::size_t g = this->g_;
  Reservation& owner = this->reserve(4);
  Reservation& sharer = this->reserve(4);
  ASSERT_TRUE(this->commit(owner, 0, 2).ok());
  const auto prefix = pattern(2 * g, testing::fresh_seed());
  this->write(owner, 0, prefix);
  const auto used = this->governor_.stats(this->tier_).used;
  for (const Block& block : owner.blocks()) {
    auto info = this->pool_->describe(block.handle);
    ASSERT_TRUE(info.ok());
    ASSERT_TRUE(sharer.map_shared(block.offset, *info).ok());
  }
  EXPECT_EQ(this->governor_.stats(this->tier_).used, used) << "a sharer adds no bytes";
  EXPECT_EQ(this->read(sharer, 0, 2 * g), prefix);
  for (const Block& block : sharer.blocks()) {
    EXPECT_TRUE(block.shared);
    EXPECT_EQ(block.access, Access::kReadOnly);
    EXPECT_EQ(this->pool_->describe(block.handle)->mappings, 2u);
  }
  // The owner's later write is seen by the sharer: one copy of the bytes.
  const auto update = pattern(g, testing::fresh_seed());
  this->write(owner, g, update);
  EXPECT_EQ(this->read(sharer, g, g), update);
  this->expect_invariants();

  ASSERT_TRUE(owner.release(0, 2 * g).ok());
  EXPECT_EQ(this->pool_->snapshot().pooled_bytes, 0u) << "the sharer still maps them";
  EXPECT_EQ(this->read(sharer, g, g), update);
  this->expect_invariants();
  ASSERT_TRUE(sharer.release(0, 2 * g).ok());
  EXPECT_EQ(this->pool_->snapshot().pooled_bytes, 2 * g);
  this->expect_invariants();
}

TYPED_TEST(ReservationTest, MapsAGranuleAlignedPartOfAMultiGranuleHandle) {
  const std::size_t g = this->g_;
  Reservation& owner = this->reserve(4);
  Reservation& sharer = this->reserve(4);
  ASSERT_TRUE(this->commit(owner, 0, 4, {.handle_bytes = 4 * g}).ok());
  ASSERT_EQ(owner.blocks().size(), 1u);
  const auto data = pattern(4 * g, testing::fresh_seed());
  this->write(owner, 0, data);
  auto info = this->pool_->describe(owner.blocks()[0].handle);
  ASSERT_TRUE(info.ok());
  if (!this->driver_->maps_handle_subranges()) {
    // CUDA maps whole handles only: refused up front, with the reason, changing nothing.
    const auto calls = this->driver_->counts().of(DriverOp::kMap);
    Status refused = sharer.map_shared(3 * g, *info, Access::kReadOnly, g, g);
    EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.to_string();
    EXPECT_NE(refused.message().find("whole handles only"), std::string::npos);
    EXPECT_EQ(this->driver_->counts().of(DriverOp::kMap), calls);
    EXPECT_EQ(sharer.mapped_bytes(), 0u);
    ASSERT_TRUE(sharer.map_shared(0, *info).ok()) << "a whole handle still maps";
    EXPECT_EQ(this->read(sharer, 0, 4 * g), data);
    this->expect_invariants();
    return;
  }
  ASSERT_TRUE(sharer.map_shared(3 * g, *info, Access::kReadOnly, g, g).ok());
  ASSERT_TRUE(sharer.map_shared(0, *info, Access::kReadOnly, 2 * g, 2 * g).ok());
  EXPECT_EQ(this->read(sharer, 3 * g, g),
            std::vector<std::uint8_t>(data.begin() + g, data.begin() + 2 * g));
  EXPECT_EQ(this->read(sharer, 0, 2 * g),
            std::vector<std::uint8_t>(data.begin() + 2 * g, data.end()));
  EXPECT_EQ(this->pool_->describe(info->handle)->mappings, 3u);
  this->expect_invariants();
}

TYPED_TEST(ReservationTest, TeardownGivesEverythingBack) {
  {
    Reservation& reservation = this->reserve(16);
    ASSERT_TRUE(this->commit(reservation, 0, 3).ok());
    ASSERT_TRUE(this->commit(reservation, 7, 5, {.handle_bytes = 5 * this->g_}).ok());
    this->reservations_.clear();
  }
  this->expect_invariants();
  this->pool_->trim(UINT64_MAX);
  const auto counts = this->driver_->counts();
  EXPECT_EQ(counts.of(DriverOp::kCreate), counts.of(DriverOp::kRelease));
  EXPECT_EQ(counts.of(DriverOp::kReserve), counts.of(DriverOp::kFree));
  EXPECT_EQ(counts.failures, decltype(counts.failures){});
  EXPECT_EQ(this->governor_.stats(this->tier_).used, 0u);
}

TYPED_TEST(ReservationTest, FailedTeardownSynchronizationLeaksDeliberatelyAndCounts) {
  const std::size_t g = this->g_;
  reset_teardown_stats();
  Reservation& reservation = this->reserve(
      8, {.teardown_synchronizer = [] { return Status::Unavailable("stream still busy (test)"); }});
  ASSERT_TRUE(this->commit(reservation, 0, 3).ok());
  const auto data = pattern(3 * g, testing::fresh_seed());
  const Address base = reservation.base();
  ASSERT_TRUE(this->driver_->write(base, data.data(), data.size()).ok());
  const auto before = this->driver_->counts();
  const auto used = this->governor_.stats(this->tier_).used;
  this->reservations_.clear();
  this->leaked_mappings_ = 3;
  this->leaked_reservations_ = 1;

  const auto after = this->driver_->counts();
  for (DriverOp op : {DriverOp::kUnmap, DriverOp::kRelease, DriverOp::kFree}) {
    EXPECT_EQ(after.of(op), before.of(op)) << "nothing " << to_string(op) << "d";
  }
  const TeardownStats stats = teardown_stats();
  EXPECT_EQ(stats.leaked_reservations, 1u);
  EXPECT_EQ(stats.leaked_blocks, 3u);
  EXPECT_EQ(stats.leaked_bytes, 3 * g);
  EXPECT_EQ(stats.leaked_address_bytes, 8 * g);
  // Not reported free, not reusable: still charged and in use.
  EXPECT_EQ(this->governor_.stats(this->tier_).used, used);
  EXPECT_EQ(this->pool_->snapshot().handles_in_use, 3u);
  EXPECT_EQ(this->pool_->snapshot().pooled_bytes, 0u);
  // The memory is still there for whatever may read it.
  std::vector<std::uint8_t> seen(3 * g);
  ASSERT_TRUE(this->driver_->read(seen.data(), base, seen.size()).ok());
  EXPECT_EQ(seen, data);
  this->expect_invariants();
}

// Every refused call returns InvalidArgument naming the values, and changes nothing.
TYPED_TEST(ReservationTest, BadInputIsRefusedAndChangesNothing) {
  const std::size_t g = this->g_;
  Reservation& reservation = this->reserve(8);
  Reservation& other = this->reserve(8);
  ASSERT_TRUE(this->commit(reservation, 2, 2).ok());
  ASSERT_TRUE(this->commit(reservation, 5, 2, {.handle_bytes = 2 * g}).ok());
  ASSERT_TRUE(this->commit(other, 0, 1).ok());

  const auto blocks_before = reservation.blocks();
  const auto pool_before = this->pool_->snapshot();
  const auto calls_before = this->driver_->counts();
  const auto used_before = this->governor_.stats(this->tier_).used;
  const auto expect_refused = [&](Status status, const std::string& mentions) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find(mentions), std::string::npos)
        << status.message() << " should mention " << mentions;
    EXPECT_EQ(reservation.blocks().size(), blocks_before.size());
    EXPECT_EQ(this->pool_->snapshot().owned_bytes, pool_before.owned_bytes);
    EXPECT_EQ(this->governor_.stats(this->tier_).used, used_before);
    const auto calls = this->driver_->counts();
    for (DriverOp op : {DriverOp::kCreate, DriverOp::kMap, DriverOp::kSetAccess, DriverOp::kUnmap,
                        DriverOp::kRelease}) {
      EXPECT_EQ(calls.of(op), calls_before.of(op)) << to_string(op) << " after " << mentions;
    }
  };
  Grant grant = this->grant(4);
  expect_refused(reservation.commit(0, 0, &grant), "empty");
  expect_refused(reservation.commit(1, g, &grant), std::to_string(g));
  expect_refused(reservation.commit(0, g + 1, &grant), std::to_string(g + 1));
  expect_refused(reservation.commit(8 * g, g, &grant), std::to_string(8 * g));
  expect_refused(reservation.commit(7 * g, 2 * g, &grant), "outside");
  expect_refused(reservation.commit(3 * g, 2 * g, &grant), "overlaps");
  expect_refused(reservation.commit(0, g, &grant, {.handle_bytes = g + 1}), "handle size");
  expect_refused(reservation.release(0, g), "not mapped");
  expect_refused(reservation.release(2 * g, 3 * g), "not mapped");
  expect_refused(reservation.release(5 * g, g), "cuts");
  expect_refused(reservation.release(6 * g, g), "cuts");
  expect_refused(reservation.release(0, 0), "empty");
  expect_refused(reservation.set_access(0, g, Access::kReadOnly), "not mapped");
  auto info = this->pool_->describe(other.blocks()[0].handle);
  ASSERT_TRUE(info.ok());
  HandleInfo foreign = *info;
  foreign.granule = 2 * g;
  expect_refused(reservation.map_shared(0, foreign), "granule");
  expect_refused(reservation.map_shared(2 * g, *info), "overlaps");
  expect_refused(reservation.map_shared(0, *info, Access::kReadOnly, g), "granule-aligned");
  HandleInfo unknown = *info;
  unknown.handle += 100000;
  expect_refused(reservation.map_shared(0, unknown), "not known");
  expect_refused(Reservation::create(*this->pool_, 0).status(), "0 bytes");
  expect_refused(Reservation::create(*this->pool_, g + 1).status(), std::to_string(g + 1));
  // Double release: the second is refused.
  ASSERT_TRUE(reservation.release(2 * g, 2 * g).ok());
  const auto after_release = this->driver_->counts();
  Status twice = reservation.release(2 * g, 2 * g);
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(this->driver_->counts().of(DriverOp::kUnmap), after_release.of(DriverOp::kUnmap));
  grant.commit_charged();
  this->expect_invariants();
}

TYPED_TEST(ReservationTest, ACommitTheGrantCannotPayForIsRefusedWithNumbers) {
  const std::size_t g = this->g_;
  Reservation& reservation = this->reserve(8);
  Grant small = this->grant(2);
  Status status = reservation.commit(0, 4 * g, &small);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  ASSERT_TRUE(status.exhaustion().has_value());
  EXPECT_EQ(status.exhaustion()->requested, g);
  EXPECT_EQ(reservation.mapped_bytes(), 0u);
  small.commit_charged();
  // The two handles it did create were released: the ledger is exactly as before.
  EXPECT_EQ(this->pool_->snapshot().owned_bytes, 0u);
  EXPECT_EQ(this->governor_.stats(this->tier_).used, 0u);
  this->expect_invariants();
  Status no_grant = reservation.commit(0, 4 * g, nullptr);
  EXPECT_EQ(no_grant.code(), StatusCode::kFailedPrecondition) << no_grant.to_string();
  this->expect_invariants();
}

TYPED_TEST(ReservationTest, WriteThroughAReadOnlySharedMappingIsRefusedByTheHardware) {
  const std::size_t g = this->g_;
  Reservation& owner = this->reserve(2);
  Reservation& sharer = this->reserve(2);
  ASSERT_TRUE(this->commit(owner, 0, 1).ok());
  const auto data = pattern(g, testing::fresh_seed());
  this->write(owner, 0, data);
  auto info = this->pool_->describe(owner.blocks()[0].handle);
  ASSERT_TRUE(sharer.map_shared(0, *info).ok());
  if constexpr (TypeParam::kIsHost) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto* bytes = reinterpret_cast<volatile std::uint8_t*>(sharer.base());
    EXPECT_DEATH({ bytes[0] = static_cast<std::uint8_t>(bytes[0] + 1); }, "");
  } else {
    const auto junk = pattern(g, testing::fresh_seed());
    Status write = this->driver_->write(sharer.base(), junk.data(), junk.size());
    EXPECT_FALSE(write.ok()) << "a copy into a read-only mapping must fail";
    // The context survives: synchronize works and the owner's bytes are intact.
    EXPECT_TRUE(this->driver_->synchronize().ok());
    ASSERT_TRUE(this->commit(owner, 1, 1).ok());
    this->write(owner, g, junk);
    EXPECT_EQ(this->read(owner, g, g), junk);
  }
  EXPECT_EQ(this->read(sharer, 0, g), data);
  EXPECT_EQ(this->read(owner, 0, g), data);
  this->expect_invariants();
}

}  // namespace
}  // namespace kvvm
