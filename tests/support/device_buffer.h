// A cudaMalloc'd buffer for the attention tests and benchmarks (CUDA builds only): uploads a
// host vector, poisons itself with 0xff bytes (NaN in fp16 and bf16), downloads. Failures
// throw, which gtest reports as a failed test.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvvm::testing {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    check(cudaMalloc(&pointer_, bytes_ == 0 ? 16 : bytes_), "cudaMalloc");
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    check(cudaMemcpy(pointer_, host.data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { (void)cudaFree(pointer_); }

  void* get() const { return pointer_; }
  std::size_t bytes() const { return bytes_; }
  void poison() { check(cudaMemset(pointer_, 0xff, bytes_), "cudaMemset"); }
  template <typename T>
  void upload(const std::vector<T>& host) {
    check(cudaMemcpy(pointer_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
  std::vector<std::uint8_t> download() const {
    std::vector<std::uint8_t> host(bytes_);
    check(cudaMemcpy(host.data(), pointer_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return host;
  }

 private:
  static void check(cudaError_t error, const char* call) {
    if (error != cudaSuccess) {
      throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(error));
    }
  }
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace kvvm::testing
