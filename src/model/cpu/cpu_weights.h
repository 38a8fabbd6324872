// The CPU backend's weights: every tensor in float32 (OpenBLAS's sgemm reads float32), converted
// once at load into a WeightStore on the host driver, so the checkpoint's mapping may be dropped
// afterwards. Streamed layers keep their float32 bytes in host staging and are written into
// their addresses (which alias the ring's slots) just before their compute: the same ring as on
// CUDA, run in order, so CI runs it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/model/config.h"
#include "kvvm/model/weight_memory.h"
#include "kvvm/model/weights.h"
#include "model/weights/expert_cache.h"
#include "model/weights/weight_store.h"

namespace kvvm::model::cpu {

// One expert's MLP (or a shared expert's).
struct CpuExpert {
  const float* gate = nullptr;  // [inter][hidden]
  const float* up = nullptr;
  const float* down = nullptr;  // [hidden][inter]
};

struct CpuLayerWeights {
  const float* input_norm = nullptr;  // [hidden]
  const float* q = nullptr;           // [out][hidden], as stored (the GEMM reads them transposed)
  const float* k = nullptr;
  const float* v = nullptr;
  const float* q_bias = nullptr;  // null unless config.qkv_bias
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* o = nullptr;       // [hidden][heads * head_dim]
  const float* o_bias = nullptr;  // null unless config.o_bias
  const float* q_norm = nullptr;  // [head_dim]; null unless config.qk_norm
  const float* k_norm = nullptr;
  const float* post_norm = nullptr;
  const float* gate = nullptr;  // [intermediate][hidden]
  const float* up = nullptr;
  const float* down = nullptr;  // [hidden][intermediate]
  // A sparse layer's (null / empty on a dense one): the router [experts][hidden], the experts,
  // and Qwen2-MoE's shared expert with its gate [hidden].
  const float* router = nullptr;
  std::vector<CpuExpert> experts;
  CpuExpert shared;
  const float* shared_gate = nullptr;
};

class CpuWeights {
 public:
  // Checks every tensor (model/weight_tensors.h) and converts it into the store; with
  // options.format kDummy draws it from options.dummy_seed instead (`weights` unused).
  static Result<std::unique_ptr<CpuWeights>> load(const ModelConfig& config,
                                                  const ModelWeights& weights,
                                                  const WeightOptions& options);

  // Before layer `layer`'s compute: a streamed layer's bytes written into its addresses.
  Status stream_in(std::uint32_t layer);

  // How many of a sparse layer's experts experts_for() can give at once: all of them when they
  // are resident, the cache's slots otherwise.
  std::uint32_t expert_capacity() const;
  // The MLPs of experts `ids` (distinct, at most expert_capacity()) of layer `layer`, rows[i]
  // tokens routed to ids[i]: the resident ones, or the cache's slots after any miss is copied
  // in (a failed copy names the expert; the cache is as it was).
  Status experts_for(std::uint32_t layer, std::span<const std::uint32_t> ids,
                     std::span<const std::uint32_t> rows, std::span<CpuExpert> out);

  const float* embed = nullptr;  // [vocab][hidden]
  std::vector<CpuLayerWeights> layers;
  const float* final_norm = nullptr;  // [hidden]
  const float* lm_head = nullptr;     // [vocab][hidden]; embed when tied

  WeightStats stats() const;

 private:
  CpuWeights() = default;
  std::unique_ptr<model::detail::WeightStore> store_;
  // Streamed layers' blocks in streamed order; with an expert cache, every expert instead (sparse
  // layer by sparse layer, experts in id order).
  std::vector<float> staging_;
  std::unique_ptr<model::detail::ExpertCache> expert_cache_;  // null unless the split caches
  std::vector<Address> expert_at_;                            // scratch: experts_for's slots
  std::uint32_t hidden_ = 0, expert_inter_ = 0, experts_ = 0;
  model::detail::ExpertOffsets expert_offsets_;
  // Read by stats() from other threads (a server's /metrics) while steps run.
  std::atomic<std::uint64_t> layer_copies_{0};
  std::uint64_t load_bytes_ = 0;
  double load_seconds_ = 0;
};

}  // namespace kvvm::model::cpu
