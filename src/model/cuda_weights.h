// The CUDA model's weights on the device, in its compute type (bf16 or fp16), one cudaMalloc
// per tensor. gate and up are stored as one [2 * intermediate][hidden] matrix so the MLP's
// two input projections are one GEMM; lm_head is the embedding's buffer when tied.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvvm/dtype.h"
#include "kvvm/model/config.h"
#include "kvvm/model/weights.h"
#include "kvvm/status.h"

namespace kvvm::model::detail {

struct DeviceLayer {
  void* input_norm = nullptr;
  void* q = nullptr;
  void* k = nullptr;
  void* v = nullptr;
  void* q_bias = nullptr;  // null without biases
  void* k_bias = nullptr;
  void* v_bias = nullptr;
  void* o = nullptr;
  void* o_bias = nullptr;
  void* post_norm = nullptr;
  void* gate_up = nullptr;  // [2 * intermediate][hidden]: gate rows, then up rows
  void* down = nullptr;
};

class DeviceWeights {
 public:
  // Checks every tensor's presence, dtype (BF16 / F16 / F32) and element count against the
  // config (InvalidArgument naming the tensor), converts to `compute` where the checkpoint's
  // type differs, and copies to the current device.
  static Result<std::unique_ptr<DeviceWeights>> upload(const ModelConfig& config,
                                                       const ModelWeights& weights, DType compute);
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;
  ~DeviceWeights();

  void* embed = nullptr;
  std::vector<DeviceLayer> layers;
  void* final_norm = nullptr;
  void* lm_head = nullptr;
  std::uint64_t bytes = 0;  // on the device

 private:
  DeviceWeights() = default;
  Result<void*> allocate(std::uint64_t bytes);
  std::vector<void*> allocations_;
};

}  // namespace kvvm::model::detail
