// KV handoff between two processes (fork): a receiver killed (SIGKILL) at every step of the
// protocol leaves the sender's memory, ledger and descriptors intact; a sender killed after
// the handoff leaves the receiver's pages readable, and its sequence able to continue, until
// the receiver lets them go.
//
// Skipped under ThreadSanitizer, which does not follow a forked child.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include "kv/kv_handoff_rig.h"
#include "support/sanitizer.h"

namespace kvvm::testing {
namespace {

constexpr std::uint64_t kProcessTokens = 10;

// The receiver's side in a child: builds its own arena, receives, and dies with SIGKILL when it
// reaches step `kill_at` the `kill_on`-th time. Never returns.
[[noreturn]] void run_receiver(int socket, HandoffStep kill_at, int kill_on) {
  auto side = make_handoff_side({.exportable = false});
  if (!side.ok()) ::_exit(10);
  int seen = 0;
  HandoffOptions options{.windows_per_message = 2};
  options.on_step = [&](HandoffStep step) {
    if (step == kill_at && ++seen == kill_on) ::raise(SIGKILL);
  };
  Result<ReceivedKv> received = receive_kv(*(*side)->arena, *(*side)->governor, socket, options);
  ::_exit(received.ok() ? 0 : 11);
}

pid_t wait_child(pid_t child, int* status) {
  pid_t done = -1;
  do {
    done = ::waitpid(child, status, 0);
  } while (done < 0 && errno == EINTR);
  return done;
}

TEST(KvHandoffProcessTest, ReceiverKilledAtEveryStepLeavesTheSenderIntact) {
  if (test::kUnderThreadSanitizer) GTEST_SKIP() << "fork under ThreadSanitizer";
  auto made = make_handoff_side();
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  HandoffSide& sender = **made;
  auto slot = admit_with_pattern(sender, kProcessTokens);
  ASSERT_TRUE(slot.ok()) << slot.status().to_string();
  const std::uint64_t used = sender.used();
  const std::size_t descriptors = open_descriptors();
  struct Point {
    HandoffStep step;
    int on;
    bool sender_succeeds;
  };
  // 3 windows at 2 a message: two batches.
  const Point points[] = {
      {HandoffStep::kManifest, 1, false}, {HandoffStep::kBatch, 1, false},
      {HandoffStep::kBatch, 2, false},    {HandoffStep::kImported, 1, false},
      {HandoffStep::kMapped, 1, false},   {HandoffStep::kAcknowledged, 1, true}};
  for (const Point& point : points) {
    SCOPED_TRACE("killed at step " + std::to_string(static_cast<int>(point.step)) + " #" +
                 std::to_string(point.on));
    const auto [mine, theirs] = seqpacket_pair();
    ASSERT_GE(mine, 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(mine);
      run_receiver(theirs, point.step, point.on);
    }
    ::close(theirs);
    Result<HandoffReport> sent = send_kv(*sender.arena, *slot, kProcessTokens, mine,
                                         HandoffOptions{.windows_per_message = 2});
    ::close(mine);
    int status = 0;
    ASSERT_EQ(wait_child(child, &status), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
    EXPECT_EQ(sent.ok(), point.sender_succeeds) << sent.status().to_string();
    if (!sent.ok()) {
      EXPECT_EQ(sent.status().code(), StatusCode::kUnavailable);
    }
    // The sender: same bytes, same ledger, handles held by its own mapping only.
    EXPECT_EQ(read_tokens(*sender.arena, *slot, kProcessTokens),
              expected_bytes(*sender.arena, kProcessTokens));
    EXPECT_EQ(sender.used(), used);
    for (const HandleInfo& info : sender.pool->handles()) {
      EXPECT_EQ(info.holds, 0u);
      EXPECT_EQ(info.mappings, 1u);
    }
    EXPECT_EQ(open_descriptors(), descriptors);
    EXPECT_EQ(check_invariants(sender.world()), "");
  }
}

TEST(KvHandoffProcessTest, SenderKilledAfterTheHandoffLeavesTheReceiverPagesValid) {
  if (test::kUnderThreadSanitizer) GTEST_SKIP() << "fork under ThreadSanitizer";
  auto made = make_handoff_side({.exportable = false});
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  HandoffSide& receiver = **made;
  const auto [mine, theirs] = seqpacket_pair();
  ASSERT_GE(mine, 0);
  int pipe_fds[2] = {-1, -1};  // the child's slot address and whether it copied nothing
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(mine);
    ::close(pipe_fds[0]);
    auto side = make_handoff_side();
    if (!side.ok()) ::_exit(10);
    auto slot = admit_with_pattern(**side, kProcessTokens);
    if (!slot.ok()) ::_exit(11);
    const std::uint64_t copies = (*side)->real->counts().of(DriverOp::kCopy);
    Result<HandoffReport> sent = send_kv(*(*side)->arena, *slot, kProcessTokens, theirs);
    const std::uint64_t facts[2] = {
        (*side)->arena->slot_base(*slot),
        sent.ok() && (*side)->real->counts().of(DriverOp::kCopy) == copies ? 1u : 0u};
    if (::write(pipe_fds[1], facts, sizeof(facts)) != sizeof(facts)) ::_exit(12);
    ::pause();  // until killed: its memory must not be what keeps the receiver's pages
    ::_exit(13);
  }
  ::close(theirs);
  ::close(pipe_fds[1]);
  const std::uint64_t copies = receiver.real->counts().of(DriverOp::kCopy);
  Result<ReceivedKv> received = receive_kv(*receiver.arena, *receiver.governor, mine);
  ::close(mine);
  std::uint64_t facts[2] = {0, 0};
  const bool told = ::read(pipe_fds[0], facts, sizeof(facts)) == sizeof(facts);
  ::close(pipe_fds[0]);
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(wait_child(child, &status), child);
  ASSERT_TRUE(received.ok()) << received.status().to_string();
  ASSERT_TRUE(told);
  EXPECT_EQ(facts[1], 1u) << "the sender's handoff failed or copied";
  EXPECT_EQ(receiver.real->counts().of(DriverOp::kCopy), copies);
  const SlotId slot = received->slot;
  EXPECT_NE(receiver.arena->slot_base(slot), facts[0]);

  // The sender is gone: its pages are still here, mapped, with its bytes.
  EXPECT_EQ(read_tokens(*receiver.arena, slot, kProcessTokens),
            expected_bytes(*receiver.arena, kProcessTokens));
  EXPECT_EQ(check_invariants(receiver.world()), "");
  // The sequence continues past the prompt (the partial window copied first).
  ASSERT_TRUE(receiver.arena->ensure(slot, kProcessTokens + 3).ok());
  const std::vector<unsigned char> more(3 * 1024, 0x5A);
  ASSERT_TRUE(
      receiver.real
          ->write(receiver.arena->slot_base(slot) + kProcessTokens * 1024, more.data(), more.size())
          .ok());
  EXPECT_EQ(read_tokens(*receiver.arena, slot, kProcessTokens),
            expected_bytes(*receiver.arena, kProcessTokens));
  // Released: the last reference to the dead sender's memory goes, and the ledger is empty.
  ASSERT_TRUE(receiver.arena->release(slot).ok());
  receiver.arena->reclaim(UINT64_MAX);
  EXPECT_EQ(receiver.used(), 0u);
  EXPECT_EQ(host_driver_tables(*receiver.real).handles, 0u);
  EXPECT_EQ(check_invariants(receiver.world()), "");
}

}  // namespace
}  // namespace kvvm::testing
