// The log sink and KVVM_CHECK: a replaced sink receives what the library says and stderr
// stays quiet; a broken precondition aborts naming file:line and the reason.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvvm/base/check.h"
#include "kvvm/base/log.h"
#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm {
namespace {

class RecordingLogger final : public Logger {
 public:
  void log(LogLevel level, std::string_view message) override {
    std::lock_guard lock(mutex_);
    entries_.push_back({level, std::string(message)});
  }
  struct Entry {
    LogLevel level;
    std::string message;
  };
  std::vector<Entry> entries() const {
    std::lock_guard lock(mutex_);
    return entries_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
};

TEST(LogSink, DefaultIsStderrAndSetterReturnsThePrevious) {
  EXPECT_EQ(&logger(), &stderr_logger());
  RecordingLogger recording;
  Logger* previous = set_logger(&recording);
  EXPECT_EQ(previous, &stderr_logger());
  EXPECT_EQ(&logger(), &recording);
  EXPECT_EQ(set_logger(nullptr), &recording);
  EXPECT_EQ(&logger(), &stderr_logger());
}

TEST(LogSink, StderrSinkWritesOneLinePerMessageWithTheLevel) {
  ::testing::internal::CaptureStderr();
  log(LogLevel::kWarning, "disk on fire");
  log(LogLevel::kInfo, "all calm");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "kvvm: WARNING: disk on fire\nkvvm: all calm\n");
}

TEST(LogSink, ReplacedSinkGetsTheLeakedHandleReportAndStderrStaysQuiet) {
  auto driver = make_host_driver();
  ASSERT_TRUE(driver.ok()) << driver.status().to_string();
  RecordingLogger recording;
  ::testing::internal::CaptureStderr();
  {
    ScopedLogger scoped(&recording);
    auto pool = std::make_unique<HandlePool>(**driver);
    auto handle = pool->checkout((*driver)->granule(), nullptr);
    ASSERT_TRUE(handle.ok()) << handle.status().to_string();
    pool.reset();  // the handle is still in use: the destructor reports it
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "");
  const auto entries = recording.entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].level, LogLevel::kWarning);
  EXPECT_NE(entries[0].message.find("1 handle(s) in use"), std::string::npos) << entries[0].message;
  EXPECT_EQ(&logger(), &stderr_logger());  // the scope restored the default
}

TEST(LogSink, ReplacedSinkGetsGovernorComplaints) {
  RecordingLogger recording;
  ScopedLogger scoped(&recording);
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ::testing::internal::CaptureStderr();
  g.return_bytes(t, 20);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  const auto entries = recording.entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_NE(entries[0].message.find("gpu0"), std::string::npos) << entries[0].message;
}

TEST(CheckDeathTest, FailedCheckAbortsNamingFileLineAndMessage) {
  const int limit = 3;
  EXPECT_DEATH(KVVM_CHECK(limit > 4, "limit " + std::to_string(limit) + " is at most 4"),
               "CHECK failed: .*base_log_test.cc:[0-9]+: limit > 4: limit 3 is at most 4");
  KVVM_CHECK(limit == 3, "never evaluated");  // a passing check does nothing
}

TEST(CheckDeathTest, FailedCheckGoesThroughTheReplacedSink) {
  EXPECT_DEATH(
      {
        // The recording sink prints to stderr itself so the death test can see it arrived.
        class Echo final : public Logger {
         public:
          void log(LogLevel, std::string_view message) override {
            std::fprintf(stderr, "echo<%.*s>\n", static_cast<int>(message.size()), message.data());
          }
        } echo;
        set_logger(&echo);
        KVVM_CHECK(false, "through the sink");
      },
      "echo<CHECK failed: .*through the sink>");
}

TEST(CheckDeathTest, MisuseOfAHandleAbortsInsteadOfBeingIgnored) {
  auto driver = make_host_driver();
  ASSERT_TRUE(driver.ok()) << driver.status().to_string();
  HandlePool pool(**driver);
  EXPECT_DEATH(pool.hold(12345), "hold of handle 12345 that is not in use");
  EXPECT_DEATH(pool.note_unmapped(12345), "note_unmapped on handle 12345 with no mapping");
  auto handle = pool.checkout((*driver)->granule(), nullptr);
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  EXPECT_DEATH(pool.unhold(*handle), "unhold of handle .* with no hold");
  pool.give_back(*handle);
  EXPECT_DEATH(pool.give_back(*handle), "give_back of handle .* that is not unmapped in use");
}

TEST(CheckDeathTest, ValueOfAFailedResultAbortsNamingTheStatus) {
  Result<int> refused = Status::InvalidArgument("size 0 is below the granule 4096");
  EXPECT_DEATH((void)refused.value(), "INVALID_ARGUMENT: size 0 is below the granule 4096");
  EXPECT_DEATH((void)*refused, "value\\(\\) of a Result");
}

}  // namespace
}  // namespace kvvm
