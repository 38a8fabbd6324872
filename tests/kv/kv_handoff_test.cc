// KV handoff within one process (two arenas on two host drivers, a socket pair, the sender on
// a thread): the bytes read back at the receiver's own addresses with no copy, a manifest that
// does not match is refused naming the value, and every driver call of the import failing in
// turn leaves the receiver with nothing and the sender intact.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "kv/kv_handoff_rig.h"

namespace kvvm::testing {
namespace {

constexpr std::uint64_t kTokens = 10;  // 2.5 windows of 4 tokens at a page granule

class KvHandoffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto made = make_handoff_side();
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    sender_ = std::move(made).value();
    auto slot = admit_with_pattern(*sender_, kTokens);
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    slot_ = *slot;
    sender_used_ = sender_->used();
  }

  // Runs one handoff: the sender on a thread, the receiver here. Each side closes its end
  // when done, as a process would by exiting.
  std::pair<Result<HandoffReport>, Result<ReceivedKv>> hand_off(HandoffSide& receiver,
                                                                HandoffOptions options = {}) {
    const auto [mine, theirs] = seqpacket_pair();
    EXPECT_GE(mine, 0);
    std::future<Result<HandoffReport>> sent = std::async(std::launch::async, [&, socket = theirs] {
      Result<HandoffReport> report = send_kv(*sender_->arena, slot_, kTokens, socket, options);
      ::close(socket);
      return report;
    });
    Result<ReceivedKv> received = receive_kv(*receiver.arena, *receiver.governor, mine, options);
    ::close(mine);
    return {sent.get(), std::move(received)};
  }

  // The sender after any handoff, whatever its outcome: its bytes, its ledger, its handles.
  void expect_sender_intact() {
    EXPECT_EQ(read_tokens(*sender_->arena, slot_, kTokens),
              expected_bytes(*sender_->arena, kTokens));
    EXPECT_EQ(sender_->used(), sender_used_);
    EXPECT_EQ(sender_->arena->tokens(slot_), kTokens);
    for (const HandleInfo& info : sender_->pool->handles()) {
      EXPECT_EQ(info.state, HandleState::kInUse);
      EXPECT_EQ(info.holds, 0u) << "handle " << info.handle;
      EXPECT_EQ(info.mappings, 1u) << "handle " << info.handle;
    }
    EXPECT_EQ(check_invariants(sender_->world()), "");
  }

  // The receiver after a failed handoff: nothing imported, mapped or charged.
  static void expect_receiver_empty(const HandoffSide& receiver) {
    EXPECT_EQ(receiver.used(), 0u);
    EXPECT_EQ(receiver.pool->snapshot().owned_bytes, 0u);
    EXPECT_EQ(host_driver_tables(*receiver.real).handles, 0u);
    EXPECT_EQ(host_driver_tables(*receiver.real).mappings, 0u);
    EXPECT_EQ(receiver.arena->stats().active_slots, 0u);
    EXPECT_EQ(check_invariants(receiver.world()), "");
  }

  std::unique_ptr<HandoffSide> sender_;
  SlotId slot_ = 0;
  std::uint64_t sender_used_ = 0;
};

TEST_F(KvHandoffTest, ReceiverReadsTheSenderBytesAtItsOwnAddressWithNoCopy) {
  auto made = make_handoff_side({.exportable = false});  // importing needs no exportable driver
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  HandoffSide& receiver = **made;
  const DriverCallCounts sender_before = sender_->real->counts();
  const DriverCallCounts receiver_before = receiver.real->counts();

  auto [sent, received] = hand_off(receiver);
  ASSERT_TRUE(sent.ok()) << sent.status().to_string();
  ASSERT_TRUE(received.ok()) << received.status().to_string();
  const std::uint64_t windows = 3;  // ceil(10 tokens / 4 per window), one fragment
  EXPECT_EQ(sent->windows, windows);
  EXPECT_EQ(received->report.windows, windows);
  EXPECT_EQ(received->report.shared_bytes, windows * receiver.granule());

  // No byte copied by either driver; one export and one import per window.
  const DriverCallCounts sender_after = sender_->real->counts();
  const DriverCallCounts receiver_after = receiver.real->counts();
  EXPECT_EQ(sender_after.of(DriverOp::kCopy), sender_before.of(DriverOp::kCopy));
  EXPECT_EQ(receiver_after.of(DriverOp::kCopy), receiver_before.of(DriverOp::kCopy));
  EXPECT_EQ(sender_after.of(DriverOp::kExport) - sender_before.of(DriverOp::kExport), windows);
  EXPECT_EQ(receiver_after.of(DriverOp::kImport) - receiver_before.of(DriverOp::kImport), windows);

  const SlotId slot = received->slot;
  EXPECT_NE(receiver.arena->slot_base(slot), sender_->arena->slot_base(slot_));
  EXPECT_EQ(receiver.arena->tokens(slot), kTokens);
  EXPECT_EQ(read_tokens(*receiver.arena, slot, kTokens), expected_bytes(*receiver.arena, kTokens));
  // The receiver's budget pays for what it maps; the sender's is unchanged.
  EXPECT_EQ(receiver.used(), windows * receiver.granule());
  EXPECT_EQ(host_driver_tables(*receiver.real).handle_files, windows);
  for (const HandleInfo& info : receiver.pool->handles()) EXPECT_TRUE(info.crosses_processes);
  expect_sender_intact();
  EXPECT_EQ(check_invariants(receiver.world()), "");

  // The receiver continues from token 10: the partial window is copied before the write, so
  // the sender's bytes never change.
  ASSERT_TRUE(receiver.arena->ensure(slot, kTokens + 1).ok());
  EXPECT_EQ(receiver.arena->stats().cow_copies, 1u);
  EXPECT_EQ(receiver.arena->stats().cow_in_place, 0u);
  const std::vector<unsigned char> token(1024, 0xEE);
  ASSERT_TRUE(
      receiver.real
          ->write(receiver.arena->slot_base(slot) + kTokens * 1024, token.data(), token.size())
          .ok());
  EXPECT_EQ(read_tokens(*receiver.arena, slot, kTokens), expected_bytes(*receiver.arena, kTokens));
  const auto* beyond =
      reinterpret_cast<const unsigned char*>(sender_->arena->slot_base(slot_) + kTokens * 1024);
  EXPECT_NE(beyond[0], 0xEE);
  expect_sender_intact();

  // Released on the receiver: its ledger and driver go back to nothing, the sender keeps all.
  ASSERT_TRUE(receiver.arena->release(slot).ok());
  receiver.arena->reclaim(UINT64_MAX);
  expect_receiver_empty(receiver);
  expect_sender_intact();
}

TEST_F(KvHandoffTest, SenderReleasingItsSlotLeavesTheReceiverPagesAndNeverReusesThem) {
  auto made = make_handoff_side({.exportable = false});
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  HandoffSide& receiver = **made;
  auto [sent, received] = hand_off(receiver);
  ASSERT_TRUE(sent.ok()) << sent.status().to_string();
  ASSERT_TRUE(received.ok()) << received.status().to_string();
  const std::uint64_t released_before = sender_->pool->snapshot().releases;
  ASSERT_TRUE(sender_->arena->release(slot_).ok());
  sender_->arena->reclaim(UINT64_MAX);
  // Exported handles are released, not pooled (the pool would hand them out as fresh memory).
  EXPECT_EQ(sender_->pool->snapshot().releases - released_before, 3u);
  EXPECT_EQ(sender_->used(), 0u);
  // A new sequence on the sender writes where the old one was: the receiver does not see it.
  auto again = admit_with_pattern(*sender_, 12);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  const std::vector<unsigned char> junk(kTokens * 1024, 0x11);
  ASSERT_TRUE(
      sender_->real->write(sender_->arena->slot_base(*again), junk.data(), junk.size()).ok());
  EXPECT_EQ(read_tokens(*receiver.arena, received->slot, kTokens),
            expected_bytes(*receiver.arena, kTokens));
  EXPECT_EQ(check_invariants(receiver.world()), "");
  EXPECT_EQ(check_invariants(sender_->world()), "");
}

struct Mismatch {
  const char* name;
  HandoffSideOptions receiver;
  const char* field;
};

TEST_F(KvHandoffTest, ManifestMismatchIsRefusedNamingTheValue) {
  const std::size_t page = sender_->granule();
  const Mismatch cases[] = {
      {"layout", {.exportable = false, .layout = Layout::kHeadMajor}, "layout"},
      {"granule", {.exportable = false, .granule = 4 * page}, "granule"},
      {"dtype", {.exportable = false, .dtype = DType::kBf16}, "dtype"},
  };
  for (const Mismatch& mismatch : cases) {
    SCOPED_TRACE(mismatch.name);
    auto made = make_handoff_side(mismatch.receiver);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    HandoffSide& receiver = **made;
    auto [sent, received] = hand_off(receiver);
    ASSERT_FALSE(received.ok());
    EXPECT_EQ(received.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(received.status().message().find(mismatch.field), std::string::npos)
        << received.status().to_string();
    ASSERT_FALSE(sent.ok());
    EXPECT_EQ(sent.status().code(), StatusCode::kInvalidArgument) << sent.status().to_string();
    EXPECT_NE(sent.status().message().find("refused"), std::string::npos);
    EXPECT_NE(sent.status().message().find(mismatch.field), std::string::npos);
    expect_receiver_empty(receiver);
    expect_sender_intact();
  }
}

TEST_F(KvHandoffTest, HandlesInSharedMemoryFilesAreNotExported) {
  auto plain = make_handoff_side({.exportable = false});
  ASSERT_TRUE(plain.ok());
  sender_ = std::move(plain).value();
  auto slot = admit_with_pattern(*sender_, kTokens);
  ASSERT_TRUE(slot.ok());
  slot_ = *slot;
  sender_used_ = sender_->used();
  auto made = make_handoff_side({.exportable = false});
  ASSERT_TRUE(made.ok());
  auto [sent, received] = hand_off(**made);
  ASSERT_FALSE(sent.ok());
  EXPECT_EQ(sent.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(sent.status().message().find("exportable_handles"), std::string::npos);
  ASSERT_FALSE(received.ok());
  EXPECT_EQ(received.status().code(), StatusCode::kUnavailable) << received.status().to_string();
  expect_receiver_empty(**made);
  expect_sender_intact();
}

TEST_F(KvHandoffTest, ReceiverShortOfBudgetRefusesWithTheNumbers) {
  auto made = make_handoff_side({.exportable = false, .budget_granules = 2});
  ASSERT_TRUE(made.ok());
  auto [sent, received] = hand_off(**made);
  ASSERT_FALSE(received.ok());
  EXPECT_EQ(received.status().code(), StatusCode::kResourceExhausted);
  ASSERT_FALSE(sent.ok());
  EXPECT_EQ(sent.status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(sent.status().exhaustion().has_value());
  EXPECT_EQ(sent.status().exhaustion()->requested, 3 * sender_->granule());
  expect_receiver_empty(**made);
  expect_sender_intact();
}

// Every driver call the receiver makes (imports, maps, access changes) fails in turn; then the
// export on the sender. Each time both sides report the failure, the receiver holds nothing and
// the sender everything, and no descriptor is left open.
TEST_F(KvHandoffTest, FaultSweepOverEveryDriverCallLeavesBothSidesWhole) {
  auto made = make_handoff_side({.exportable = false});
  ASSERT_TRUE(made.ok());
  HandoffSide& receiver = **made;
  const HandoffOptions options{.windows_per_message = 2};
  const std::size_t descriptors = open_descriptors();
  struct Target {
    FaultDriver* driver;
    DriverOp op;
  };
  const Target targets[] = {{receiver.fault.get(), DriverOp::kImport},
                            {receiver.fault.get(), DriverOp::kMap},
                            {receiver.fault.get(), DriverOp::kSetAccess},
                            {sender_->fault.get(), DriverOp::kExport}};
  for (const Target& target : targets) {
    std::uint64_t injected = 0;
    for (std::uint64_t n = 1; n < 64; ++n) {
      SCOPED_TRACE(std::string(to_string(target.op)) + " #" + std::to_string(n));
      const std::uint64_t before = target.driver->injected();
      target.driver->fail_nth(target.op, n);
      auto [sent, received] = hand_off(receiver, options);
      target.driver->clear();
      if (target.driver->injected() == before) {
        // Fewer than n calls: the handoff went through; undo it for the next target.
        ASSERT_TRUE(received.ok()) << received.status().to_string();
        ASSERT_TRUE(sent.ok()) << sent.status().to_string();
        ASSERT_TRUE(receiver.arena->release(received->slot).ok());
        receiver.arena->reclaim(UINT64_MAX);
        break;
      }
      ++injected;
      EXPECT_FALSE(received.ok());
      EXPECT_FALSE(sent.ok());
      expect_receiver_empty(receiver);
      expect_sender_intact();
      EXPECT_EQ(open_descriptors(), descriptors);
    }
    EXPECT_GE(injected, 1u) << to_string(target.op);
  }
  expect_receiver_empty(receiver);
  EXPECT_EQ(open_descriptors(), descriptors);
}

}  // namespace
}  // namespace kvvm::testing
