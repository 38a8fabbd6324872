// What the tests of overlapped launches share (programmatic dependent launch: a kernel launched
// with launch_overlapping starts under its predecessor's tail and must read that kernel's
// output, not what its memory held before). The kernel before is a late copy
// (support/write_kernel.h): it lets the next kernel start at once and writes the reader's input
// only 200 µs later, so a reader that loads it before waiting (a load the compiler moved above
// the wait, as ptxas did with __ldg's non-coherent loads) computes on the old contents. The
// reader's output must equal, bit for bit, the same call with the new input in place from the
// start; the old contents are checked to give another answer, so an early read cannot pass.
// Built only with the CUDA compiler.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/element.h"
#include "kvvm/base/status.h"
#include "support/cuda_device.h"
#include "support/device_buffer.h"
#include "support/write_kernel.h"

namespace kvvm::testing {

class LateCopyTest : public ::testing::Test {
 protected:
  static constexpr unsigned kLateMicroseconds = 200;

  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  // `read(input)` enqueues the reader on stream_ over `input`, writing `out`. Runs it over
  // `fresh`, over `stale`, then over `stale` that a late copy overwrites with `fresh`.
  void expect_reads_the_late_copy(const std::vector<std::uint8_t>& fresh,
                                  const std::vector<std::uint8_t>& stale, DeviceBuffer& out,
                                  const std::function<Status(const void*)>& read,
                                  const std::string& what) {
    ASSERT_EQ(fresh.size(), stale.size());
    DeviceBuffer source(fresh), target(stale);
    const auto run = [&](const void* input) {
      poison(out);
      const Status status = read(input);
      EXPECT_TRUE(status.ok()) << what << ": " << status.to_string();
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << what;
      return out.download();
    };
    const std::vector<std::uint8_t> want = run(source.get());
    ASSERT_NE(run(target.get()), want) << what << ": the old input gives the same answer";
    for (int attempt = 0; attempt < 3; ++attempt) {
      target.upload(stale);
      poison(out);
      ASSERT_TRUE(testkit::copy_late_on_gpu(stream_, target.get(), source.get(), fresh.size(),
                                            kLateMicroseconds)
                      .ok());
      const Status status = read(target.get());
      ASSERT_TRUE(status.ok()) << what << ": " << status.to_string();
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << what;
      EXPECT_EQ(out.download(), want)
          << what << ": read its input before the kernel before it wrote it (attempt " << attempt
          << ")";
    }
  }

  // DeviceBuffer's memset and copies run on the legacy stream, which stream_ (non-blocking)
  // does not wait for: they must have ended before the reader is enqueued.
  static void poison(DeviceBuffer& buffer) {
    buffer.poison();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  cudaStream_t stream_ = nullptr;
  std::mt19937 rng_{29};
};

inline std::vector<std::uint8_t> bytes_of(const std::vector<std::uint16_t>& values) {
  std::vector<std::uint8_t> bytes(values.size() * 2);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

inline std::vector<std::uint16_t> random_bf16(std::size_t count, std::mt19937& rng,
                                              float deviation = 1.0f) {
  std::normal_distribution<float> value(0.0f, deviation);
  std::vector<std::uint16_t> out(count);
  for (std::uint16_t& v : out) v = kernels::float_to_bf16(value(rng));
  return out;
}

}  // namespace kvvm::testing
