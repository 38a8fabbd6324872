// What the FP8 kernels' tests share: a projection's e4m3 weights with scales that differ block by
// block (powers of two from 1/8 to 8, so a scale read from the wrong block or in the wrong layout
// fails), random activations, a device buffer read back, and the host's quantization of the
// activations the kernels' is compared with bit for bit.
#pragma once

#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/element.h"
#include "kvvm/kernels/fp8_kernels.h"
#include "kvvm/kernels/model_kernels.h"
#include "support/cuda_device.h"
#include "support/device_buffer.h"

namespace kvvm::fp8_kernels_test {

using testing::DeviceBuffer;
using testing::have_cuda_device;

// A projection's e4m3 weights, their scales in the store's layout and the dequantized values.
struct Weights {
  std::uint32_t out = 0, in = 0;
  Fp8Scales kind = Fp8Scales::kBlock128;
  std::vector<std::uint8_t> codes;  // [out][in]
  std::vector<float> scales;        // block: [ceil(out / 128)][padded row]; channel: [out]
  std::uint32_t scale_row = 0;
  double at(std::uint32_t n, std::uint32_t k) const {
    const double s =
        kind == Fp8Scales::kBlock128 ? scales[(n / 128) * scale_row + k / 128] : scales[n];
    return static_cast<double>(kernels::e4m3_to_float(codes[std::size_t{n} * in + k])) * s;
  }
};

inline Weights make_weights(std::uint32_t out, std::uint32_t in, Fp8Scales kind,
                            std::mt19937& rng) {
  Weights w;
  w.out = out;
  w.in = in;
  w.kind = kind;
  std::normal_distribution<float> value(0.0f, 100.0f);
  std::uniform_int_distribution<int> exponent(-3, 3);
  w.codes.resize(std::size_t{out} * in);
  for (std::uint8_t& c : w.codes) c = kernels::float_to_e4m3(value(rng));
  if (kind == Fp8Scales::kBlock128) {
    w.scale_row = ((in + 127) / 128 + 3) / 4 * 4;
    w.scales.assign(std::size_t{(out + 127) / 128} * w.scale_row, 0.0f);
    for (std::uint32_t nb = 0; nb < (out + 127) / 128; ++nb) {
      for (std::uint32_t kb = 0; kb < (in + 127) / 128; ++kb) {
        w.scales[nb * w.scale_row + kb] = std::ldexp(1.0f / 512, exponent(rng));
      }
    }
  } else {
    w.scales.resize(out);
    for (float& s : w.scales) s = std::ldexp(1.0f / 512, exponent(rng));
  }
  return w;
}

inline std::uint16_t to_bits(DType type, float value) {
  return type == DType::kBf16 ? kernels::float_to_bf16(value) : kernels::float_to_half(value);
}
inline float from_bits(DType type, std::uint16_t bits) {
  return type == DType::kBf16 ? kernels::bf16_to_float(bits) : kernels::half_to_float(bits);
}

inline std::vector<std::uint16_t> random_activations(DType type, std::size_t count,
                                                     std::mt19937& rng) {
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<std::uint16_t> x(count);
  for (std::uint16_t& v : x) v = to_bits(type, value(rng));
  return x;
}

template <typename T>
std::vector<T> download(const DeviceBuffer& buffer) {
  const std::vector<std::uint8_t> bytes = buffer.download();
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// The host's quantization, as the kernel's contract says it: scale amax / 448 (1 for zeros),
// codes x / scale rounded to e4m3.
struct Quantized {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
};
inline Quantized quantize_on_host(const std::vector<std::uint16_t>& x, DType type, Fp8Scales kind,
                                  std::uint32_t rows, std::uint32_t in, std::uint32_t stride) {
  Quantized q;
  q.codes.assign(std::size_t{stride} * in, 0);
  const std::uint32_t group = kind == Fp8Scales::kBlock128 ? 128 : in;
  const std::uint32_t groups = in / group;
  q.scales.assign(kind == Fp8Scales::kBlock128 ? std::size_t{groups} * stride : stride, 1.0f);
  for (std::uint32_t r = 0; r < rows; ++r) {
    for (std::uint32_t g = 0; g < groups; ++g) {
      float amax = 0;
      for (std::uint32_t k = g * group; k < (g + 1) * group; ++k) {
        amax = std::fmax(amax, std::fabs(from_bits(type, x[std::size_t{r} * in + k])));
      }
      const float scale = amax > 0 ? amax / 448.0f : 1.0f;
      for (std::uint32_t k = g * group; k < (g + 1) * group; ++k) {
        q.codes[std::size_t{r} * in + k] =
            kernels::float_to_e4m3(from_bits(type, x[std::size_t{r} * in + k]) / scale);
      }
      q.scales[kind == Fp8Scales::kBlock128 ? std::size_t{g} * stride + r : r] = scale;
    }
  }
  return q;
}

}  // namespace kvvm::fp8_kernels_test

#endif  // KVVM_HAS_CUDA_KERNELS
