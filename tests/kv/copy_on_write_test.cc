// CopyOnWrite on its own: a read-only granule becomes writable in place when no one else maps
// its handle, by copy into a fresh handle when someone does, and is left as it was when a
// step fails.
#include "kv/copy_on_write.h"

#include <gtest/gtest.h>

#include <vector>

#include "support/pattern.h"
#include "support/vmm_fixture.h"

namespace kvvm {
namespace {

class CopyOnWriteTest : public testing::VmmFixture {
 protected:
  // A reservation of two granules holding a pattern, read-only; with `shared`, a second
  // reservation maps the same handles read-only too.
  void SetUp() override {
    VmmFixture::SetUp();
    auto cow = CopyOnWrite::create(*pool_, governor_, tier_, 2, std::chrono::milliseconds(0));
    ASSERT_TRUE(cow.ok()) << cow.status().to_string();
    cow_ = std::move(cow).value();
    auto owner = Reservation::create(*pool_, 2 * g_);
    ASSERT_TRUE(owner.ok());
    owner_ = std::move(owner).value();
    Result<Grant> grant = governor_.prepare(tier_, 2 * g_);
    ASSERT_TRUE(grant.ok()) << grant.status().to_string();
    ASSERT_TRUE(owner_->commit(0, 2 * g_, &*grant).ok());
    grant->commit_charged();
    data_ = testing::pattern(2 * g_, 7);
    ASSERT_TRUE(fault_->write(owner_->base(), data_.data(), data_.size()).ok());
    ASSERT_TRUE(owner_->set_access(0, 2 * g_, Access::kReadOnly).ok());
  }
  void share() {
    auto other = Reservation::create(*pool_, 2 * g_);
    ASSERT_TRUE(other.ok());
    other_ = std::move(other).value();
    for (std::size_t at = 0; at < 2 * g_; at += g_) {
      auto info = pool_->describe(owner_->blocks_in(at, g_).front().handle);
      ASSERT_TRUE(info.ok());
      ASSERT_TRUE(other_->map_shared(at, *info).ok());
    }
  }
  std::vector<std::uint8_t> read(const Reservation& r, std::size_t at) {
    std::vector<std::uint8_t> bytes(g_);
    EXPECT_TRUE(fault_->read(bytes.data(), r.base() + at, g_).ok());
    return bytes;
  }
  std::vector<std::uint8_t> expected(std::size_t at) {
    return {data_.begin() + static_cast<std::ptrdiff_t>(at),
            data_.begin() + static_cast<std::ptrdiff_t>(at + g_)};
  }
  void TearDown() override {
    other_.reset();
    owner_.reset();
    cow_.reset();
  }

  std::unique_ptr<CopyOnWrite> cow_;
  std::unique_ptr<Reservation> owner_;
  std::unique_ptr<Reservation> other_;
  std::vector<std::uint8_t> data_;
};

TEST_F(CopyOnWriteTest, AnUnsharedWindowTurnsWritableInPlace) {
  const Handle before = owner_->blocks_in(g_, g_).front().handle;
  const std::uint64_t charged = used();
  auto made = cow_->make_writable(*owner_, g_, 0, nullptr);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  EXPECT_EQ(*made, CopyOnWrite::Outcome::kInPlace);
  EXPECT_EQ(owner_->blocks_in(g_, g_).front().handle, before);
  EXPECT_EQ(owner_->blocks_in(g_, g_).front().access, Access::kReadWrite);
  EXPECT_EQ(used(), charged);
  auto again = cow_->make_writable(*owner_, g_, 0, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, CopyOnWrite::Outcome::kAlreadyWritable);
}

TEST_F(CopyOnWriteTest, ASharedWindowIsCopiedIntoAFreshHandle) {
  share();
  const Handle before = owner_->blocks_in(0, g_).front().handle;
  const std::uint64_t charged = used();
  auto made = cow_->make_writable(*owner_, 0, 1, nullptr);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  EXPECT_EQ(*made, CopyOnWrite::Outcome::kCopied);
  const Block after = owner_->blocks_in(0, g_).front();
  EXPECT_NE(after.handle, before);
  EXPECT_EQ(after.access, Access::kReadWrite);
  EXPECT_EQ(read(*owner_, 0), expected(0)) << "the copy holds the old bytes";
  EXPECT_EQ(read(*other_, 0), expected(0)) << "the other sharer keeps the original";
  EXPECT_EQ(used(), charged + g_);
  EXPECT_EQ(cow_->scratch().mapped_bytes(), 0u) << "the scratch window is unmapped again";
}

TEST_F(CopyOnWriteTest, AFailedCopyLeavesTheWindowAndTheBudgetAsTheyWere) {
  share();
  for (DriverOp op : {DriverOp::kCreate, DriverOp::kMap, DriverOp::kCopy}) {
    SCOPED_TRACE(std::string(to_string(op)));
    const Block before = owner_->blocks_in(0, g_).front();
    const std::uint64_t charged = used();
    fault_->fail_nth(op, 1);
    auto made = cow_->make_writable(*owner_, 0, 0, nullptr);
    fault_->clear();
    ASSERT_FALSE(made.ok());
    const Block after = owner_->blocks_in(0, g_).front();
    EXPECT_EQ(after.handle, before.handle);
    EXPECT_EQ(after.access, Access::kReadOnly);
    EXPECT_EQ(read(*owner_, 0), expected(0));
    EXPECT_EQ(used(), charged);
    EXPECT_EQ(cow_->scratch().mapped_bytes(), 0u);
  }
}

TEST_F(CopyOnWriteTest, AFailedFenceKeepsWhatTheCopyWritesUntilALaterFence) {
  // The fence after the copy, recorded (call 1) or waited for (call 2), fails: the copy may
  // still be writing the fresh handle, so its scratch mapping and charge stay, and the window
  // keeps its old mapping; the lane's next use first settles it with a fence that completes.
  share();
  for (std::uint64_t call : {1u, 2u}) {
    SCOPED_TRACE("fence call " + std::to_string(call));
    const Block before = owner_->blocks_in(0, g_).front();
    const std::uint64_t charged = used();
    fault_->fail_nth(DriverOp::kFence, call);
    auto made = cow_->make_writable(*owner_, 0, 0, nullptr);
    fault_->clear();
    ASSERT_FALSE(made.ok());
    EXPECT_NE(made.status().message().find("completion is unknown"), std::string::npos)
        << made.status().to_string();
    EXPECT_EQ(owner_->blocks_in(0, g_).front().handle, before.handle);
    EXPECT_EQ(owner_->blocks_in(0, g_).front().access, Access::kReadOnly);
    EXPECT_EQ(cow_->scratch().mapped_bytes(), g_) << "the copy's destination stays mapped";
    EXPECT_GE(used(), charged) << "and charged";
    EXPECT_EQ(cow_->unsettled().lanes, 1u);
    EXPECT_EQ(cow_->unsettled().bytes, g_);
    EXPECT_TRUE(cow_->unsettled(0));
    EXPECT_EQ(fault_->copies_in_flight(), 1u);
    EXPECT_TRUE(fault_->in_flight_violations().empty());
    // Settling fails while fences still fail, changing nothing.
    fault_->fail_nth(DriverOp::kFence, 1);
    EXPECT_EQ(cow_->settle(0).code(), StatusCode::kUnavailable);
    fault_->clear();
    EXPECT_EQ(cow_->scratch().mapped_bytes(), g_);
    // A fence that completes lets the scratch window and the fresh handle go.
    ASSERT_TRUE(cow_->settle(0).ok());
    EXPECT_EQ(fault_->copies_in_flight(), 0u);
    EXPECT_EQ(cow_->scratch().mapped_bytes(), 0u);
    EXPECT_EQ(cow_->unsettled().lanes, 0u);
    EXPECT_EQ(used(), charged);
    EXPECT_TRUE(fault_->in_flight_violations().empty());
    EXPECT_EQ(read(*owner_, 0), expected(0));
  }
}

TEST_F(CopyOnWriteTest, RefusesAWindowThatIsNotOneMapping) {
  ASSERT_TRUE(owner_->release(g_, g_).ok());
  auto made = cow_->make_writable(*owner_, g_, 0, nullptr);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvvm
