// Backends for the typed suites: every behaviour runs on the host driver (always, with the
// page size and with a GPU-like 2 MiB granule) and on the CUDA driver (skipped, and reported
// as skipped, when no GPU is present).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kvvm/vmm/driver.h"

namespace kvvm::testing {

struct HostPageBackend {
  static constexpr const char* kName = "host";
  static constexpr bool kIsHost = true;
  static std::unique_ptr<Driver> make();
};
struct Host2MiBBackend {
  static constexpr const char* kName = "host2m";
  static constexpr bool kIsHost = true;
  static std::unique_ptr<Driver> make();
};
struct CudaBackend {
  static constexpr const char* kName = "cuda";
  static constexpr bool kIsHost = false;
  // Null when no GPU is usable here; the caller skips.
  static std::unique_ptr<Driver> make();
  static std::string unavailable_reason();
};

using AllBackends = ::testing::Types<HostPageBackend, Host2MiBBackend, CudaBackend>;

struct BackendNames {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};

// Makes the backend's driver, or skips the running test (GTEST_SKIP) with the reason.
// Usage in SetUp(): driver_ = make_or_skip<TypeParam>(); if (!driver_) return;
template <typename B>
std::unique_ptr<Driver> make_driver_or_null() {
  return B::make();
}

}  // namespace kvvm::testing

#define KVVM_MAKE_DRIVER_OR_SKIP(Backend, target)                                               \
  do {                                                                                          \
    target = ::kvvm::testing::make_driver_or_null<Backend>();                                   \
    if (!target) {                                                                              \
      GTEST_SKIP() << "no CUDA device: " << ::kvvm::testing::CudaBackend::unavailable_reason(); \
    }                                                                                           \
  } while (0)
