// The rotary position embedding of one pair (x[i], x[i + d/2]) of a head row, rotate_half
// form, rounded where Hugging Face's eager ops round (include/kvvm/kernels/model_kernels.h,
// RopeParams). One function for the standalone rope kernel and the rope fused into the KV append,
// so the two give the same bits.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"

namespace kvvm::kernels {

template <typename T>
struct RotatedPair {
  T low;   // the new x[i]
  T high;  // the new x[i + d/2]
};

template <typename T>
__device__ __forceinline__ RotatedPair<T> rotate_pair(T low, T high, float position,
                                                      float inv_freq) {
  const float angle = position * inv_freq;
  const float c = rounded<T>(cosf(angle));
  const float s = rounded<T>(sinf(angle));
  const float x1 = to_float<T>(low);
  const float x2 = to_float<T>(high);
  return {from_float<T>(rounded<T>(x1 * c) + rounded<T>(-x2 * s)),
          from_float<T>(rounded<T>(x2 * c) + rounded<T>(x1 * s))};
}

}  // namespace kvvm::kernels
