// The dummy weights' values (--load-format dummy): a counter-based hash of (seed, tensor,
// index) mapped to uniform [-scale, scale), the same on the host and in the CUDA fill kernel,
// so a dummy model computes the same on both backends (up to the device's 16-bit rounding).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KVVM_HOST_DEVICE __host__ __device__
#else
#define KVVM_HOST_DEVICE
#endif

namespace kvvm::kernels {

KVVM_HOST_DEVICE inline float dummy_value(std::uint64_t seed, std::uint32_t tensor,
                                          std::uint64_t index, float scale) {
  // splitmix64's finalizer over a key that mixes the three numbers with odd constants.
  std::uint64_t x = seed + 0x9E3779B97F4A7C15ull * (std::uint64_t{tensor} + 1);
  x ^= index * 0xD1B54A32D192ED03ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  const float unit = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
  return (2.0f * unit - 1.0f) * scale;
}

}  // namespace kvvm::kernels
