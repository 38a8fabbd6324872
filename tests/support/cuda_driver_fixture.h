// The CUDA driver tests' shared pieces: status macros, byte helpers and the fixture that
// skips without a usable GPU and undoes every call a test made.
#pragma once

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

#include "kvvm/base/status.h"
#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/driver.h"

#define KVVM_CUDA_CONCAT_INNER(a, b) a##b
#define KVVM_CUDA_CONCAT(a, b) KVVM_CUDA_CONCAT_INNER(a, b)

// Fails the test (fatally) with the status text when `expr` is not OK.
#define KVVM_CUDA_ASSERT_OK(expr)                                                          \
  do {                                                                                     \
    const ::kvvm::Status kvvm_cuda_status_ = (expr);                                       \
    ASSERT_TRUE(kvvm_cuda_status_.ok()) << #expr << ": " << kvvm_cuda_status_.to_string(); \
  } while (0)

// `lhs = value of expr`, or a fatal failure with the status text.
#define KVVM_CUDA_ASSIGN_OR_FAIL(lhs, expr)                                                   \
  auto KVVM_CUDA_CONCAT(kvvm_cuda_result_, __LINE__) = (expr);                                \
  ASSERT_TRUE(KVVM_CUDA_CONCAT(kvvm_cuda_result_, __LINE__).ok())                             \
      << #expr << ": " << KVVM_CUDA_CONCAT(kvvm_cuda_result_, __LINE__).status().to_string(); \
  lhs = std::move(KVVM_CUDA_CONCAT(kvvm_cuda_result_, __LINE__)).value()

namespace kvvm::testing {

using Bytes = std::vector<unsigned char>;

inline std::string unavailable_reason() {
  auto driver = make_cuda_driver();
  return driver.ok() ? std::string("available") : driver.status().to_string();
}

// What CUDA did, for the log of a GPU run (and the XML report through RecordProperty, hence
// a key that is a valid XML attribute name).
inline void say(const std::string& key, const std::string& line) {
  std::cout << "[ CUDA ] " << key << ": " << line << std::endl;
  ::testing::Test::RecordProperty(key, line);
}

inline Bytes random_bytes(std::size_t bytes, std::uint64_t seed) {
  Bytes out(bytes);
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < bytes; i += 8) {
    const std::uint64_t word = rng();
    std::memcpy(out.data() + i, &word, std::min<std::size_t>(8, bytes - i));
  }
  return out;
}

inline ::testing::AssertionResult same_bytes(const Bytes& expected, const Bytes& actual) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << expected.size() << " vs " << actual.size();
  }
  auto [e, a] = std::mismatch(expected.begin(), expected.end(), actual.begin());
  if (e == expected.end()) return ::testing::AssertionSuccess();
  const auto index = static_cast<std::size_t>(e - expected.begin());
  std::size_t differing = 0;
  for (std::size_t i = index; i < expected.size(); ++i) differing += expected[i] != actual[i];
  return ::testing::AssertionFailure()
         << "first difference at byte " << index << " of " << expected.size() << " (expected "
         << int{expected[index]} << ", got " << int{actual[index]} << "); " << differing
         << " bytes differ";
}

// The fixture is in a named namespace: its tests are spread over several files and gtest
// requires one fixture class per suite.
class CudaDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no usable CUDA device: " << unavailable_reason();
    auto driver = make_cuda_driver();
    if (!driver.ok() && driver.status().code() == StatusCode::kUnavailable) {
      GTEST_SKIP() << "CUDA device 0 is not usable: " << driver.status().to_string();
    }
    ASSERT_TRUE(driver.ok()) << driver.status().to_string();
    driver_ = std::move(driver).value();
    g_ = driver_->granule();
    ASSERT_GT(g_, 0u);
  }

  void TearDown() override {
    // Undo in reverse; steps that no longer apply (already unmapped by the test) just fail.
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) (*it)();
    undo_.clear();
    driver_.reset();
  }

  // The driver calls, with the undo recorded on success so a failing test leaks nothing.
  Result<Address> reserve(std::size_t bytes) {
    Result<Address> address = driver_->reserve(bytes);
    if (address.ok()) {
      undo_.push_back([this, a = *address, bytes] { driver_->free(a, bytes).ignore(); });
    }
    return address;
  }
  Result<Handle> create(std::size_t bytes) {
    Result<Handle> handle = driver_->create(bytes);
    if (handle.ok()) undo_.push_back([this, h = *handle] { driver_->release(h).ignore(); });
    return handle;
  }
  Status map(Address address, std::size_t bytes, Handle handle, std::size_t offset = 0) {
    Status status = driver_->map(address, bytes, handle, offset);
    if (status.ok()) {
      undo_.push_back([this, address, bytes] { driver_->unmap(address, bytes).ignore(); });
    }
    return status;
  }
  // reserve + create + map + read-write access of `bytes` at a fresh address.
  Result<Address> fresh_read_write(std::size_t bytes) {
    Result<Address> address = reserve(bytes);
    if (!address.ok()) return address;
    Result<Handle> handle = create(bytes);
    if (!handle.ok()) return handle.status();
    KVVM_RETURN_IF_ERROR(map(*address, bytes, *handle));
    KVVM_RETURN_IF_ERROR(driver_->set_access(*address, bytes, Access::kReadWrite));
    return address;
  }
  Result<Bytes> read(Address address, std::size_t bytes) {
    Bytes out(bytes);
    KVVM_RETURN_IF_ERROR(driver_->read(out.data(), address, bytes));
    return out;
  }

  std::unique_ptr<Driver> driver_;
  std::size_t g_ = 0;
  std::vector<std::function<void()>> undo_;
};

}  // namespace kvvm::testing
