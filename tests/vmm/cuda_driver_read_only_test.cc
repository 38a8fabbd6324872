// Tests of the CUDA driver (src/vmm/cuda_driver.cc) with a GPU (skipped without one): what a
// write or a copy into a read-only mapping does. Anything that may fault the device runs in a
// child process (a death test, "threadsafe" style: the binary is re-executed), so a poisoned
// context cannot take the rest of the suite with it; what CUDA did is printed as a line
// starting with "[ CUDA ]".
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

#include "kvvm/vmm/cuda_driver.h"
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
