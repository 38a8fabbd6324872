// Tests of what make_cuda_driver (src/vmm/cuda_driver.cc) says when there is no usable
// device: these run everywhere.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvvm
