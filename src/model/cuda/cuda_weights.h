// The CUDA model's weights in its compute type (bf16 or fp16), in a WeightStore on the CUDA
// driver: every tensor at a stable device address, resident layers committed at load, streamed
// layers' bytes in pinned host memory (copied into their ring slots step by step by
// WeightRing, model/cuda_weight_ring.h). gate and up are one [2 * intermediate][hidden] matrix
// so the MLP's two input projections are one GEMM; lm_head is the embedding's when tied. An FP8
// checkpoint's projections are copied as stored (e4m3) with their scales converted to float32.
//
// Why the load is a pipeline: a checkpoint's pages are pageable memory, which the device copies
// from at a few GB/s; staged through a few pinned buffers (filled by several host threads while
// the previous buffer's copy runs) the load runs near the link's rate.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"
#include "kvvm/model/config.h"
#include "kvvm/model/weight_memory.h"
#include "kvvm/model/weights.h"
#include "model/cuda/cuda_expert_residency.h"
#include "model/weights/weight_store.h"

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
  void* q_norm = nullptr;  // [head_dim]; null without q/k norms
  void* k_norm = nullptr;
  void* post_norm = nullptr;
  void* gate_up = nullptr;  // [2 * intermediate][hidden]: gate rows, then up rows
  void* down = nullptr;
  // An FP8 checkpoint's projections (q ... down e4m3 as stored) and their float32 scales
  // (model/weight_layout.h): null unquantized. k's and v's point into q's run, up's into
  // gate's, as the weights do.
  const float* q_scales = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  const float* o_scales = nullptr;
  const float* gate_up_scales = nullptr;
  const float* down_scales = nullptr;
  // A sparse layer's (null on a dense one): the router [experts][hidden], the per-expert pointer
  // tables the MoE kernels read (in the base region: each expert's gate|up and down, and their
  // scales in an FP8 checkpoint), and Qwen2-MoE's shared expert with its gate [1][hidden].
  void* router = nullptr;
  const void* const* expert_gate_up = nullptr;
  const void* const* expert_down = nullptr;
  const float* const* expert_gate_up_scales = nullptr;
  const float* const* expert_down_scales = nullptr;
  void* shared_gate = nullptr;
  void* shared_gate_up = nullptr;
  void* shared_down = nullptr;
  const float* shared_gate_up_scales = nullptr;
  const float* shared_down_scales = nullptr;
};

class DeviceWeights {
 public:
  // Checks every tensor (model/weight_tensors.h), converts to `compute` where the checkpoint's
  // type differs, and loads it into the store on the current device (options.format kDummy:
  // draws it there, `weights` unread). `stream`: the model's.
  static Result<std::unique_ptr<DeviceWeights>> upload(const ModelConfig& config,
                                                       const ModelWeights& weights, DType compute,
                                                       const WeightOptions& options, void* stream);
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;
  ~DeviceWeights();

  void* embed = nullptr;
  std::vector<DeviceLayer> layers;
  void* final_norm = nullptr;
  void* lm_head = nullptr;

  const WeightStore& store() const { return *store_; }
  // Streamed layer `layer`'s bytes in pinned host memory.
  const void* staged(std::uint32_t layer) const;
  WeightStats stats(std::uint64_t layer_copies) const;

  // Whether a mixture's experts are cached (store().split().expert_cache()).
  bool expert_cache() const { return residency_ != nullptr; }
  // With the experts cached: enqueues on the model's stream the residency of layer `layer`'s
  // experts routed by `ids` ([tokens][top_k] on the device), decided and copied on the device
  // (DeviceExpertResidency), the layer's pointer tables rewritten there. Capturable.
  Status acquire_experts(std::uint32_t layer, std::uint32_t tokens, std::uint32_t top_k,
                         const std::int32_t* ids) const;

 private:
  DeviceWeights() = default;
  Status bind_experts(const ModelConfig& config, void* stream);
  std::unique_ptr<WeightStore> store_;
  // Pinned: streamed layers' blocks in streamed order; with an expert cache, every expert
  // instead (sparse layer by sparse layer, experts in id order).
  unsigned char* staging_ = nullptr;
  std::unique_ptr<DeviceExpertResidency> residency_;
  void* stream_ = nullptr;     // the model's: the residency's kernels run on it
  std::uint32_t experts_ = 0;  // per sparse layer
  std::uint64_t load_bytes_ = 0;
  double load_seconds_ = 0;
};

}  // namespace kvvm::model::detail
