// The CUDA backend of Model (include/kvvm/model/model.h): cuBLAS GEMMs in bf16 / fp16 with
// float32 accumulation (a GEMV for steps of a row or two), the model kernels (model_kernels.h)
// and the attention kernels (attention.h) on one stream.
//
// Why everything is sized at creation: a step allocates nothing (docs/ARCHITECTURE.md "Model
// runtime"), so a decode step can be captured in a CUDA graph and replayed (cuda_graphs.cc). The
// step's per-token and per-chunk arrays (ids, positions, slots, lengths, last rows, sampling
// parameters, logit-transform rows) live in one block of 32-bit words that the host fills in
// pinned memory and copies with one cudaMemcpyAsync, outside any graph; a step with logit
// transforms copies its LogitAdjustment entries with a second one, into a buffer of
// max_logit_adjustments entries at a fixed address; the decode workspace is planned for the
// largest batch at max_position_embeddings.
//
// Not thread-safe: one step at a time.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/kernels/model_kernels.h"
#include "kvvm/model/model.h"
#include "model/cuda/cuda_weight_ring.h"
#include "model/cuda/cuda_weights.h"
#include "model/cuda/fp8_matmul.h"

namespace kvvm::model::detail {

class CudaModel final : public Model {
 public:
  static Result<std::unique_ptr<Model>> create(const ModelConfig& config,
                                               const ModelWeights& weights,
                                               const CudaModelOptions& options);
  ~CudaModel() override;
  Backend backend() const override { return Backend::kCuda; }
  Status forward(const StepBatch& batch, const StepOutput& out) override;
  Status capture_decode_graphs(const DecodeGraphOptions& options) override;
  void release_decode_graphs() override;
  GraphStats graph_stats() const override;
  ForwardWaits forward_waits() const override { return waits_; }
  WeightStats weight_stats() const override;

 private:
  // Consecutive single-token chunks: one decode_attention_cuda call over their rows.
  struct DecodeRun {
    std::uint32_t first_row = 0;
    std::uint32_t first_decode = 0;  // index into the decode slot / length arrays
    std::uint32_t count = 0;
    // The longest sequence of the run: the decode's split is planned from it, so a short
    // sequence is not split as if it were max_position_embeddings long (empty chunks cost a
    // block each). A captured graph plans from the bound of every replay instead.
    std::uint32_t max_length = 0;
  };
  // One captured decode step of `batch` rows.
  struct DecodeGraph {
    std::uint32_t batch = 0;
    cudaGraphExec_t exec = nullptr;
  };
  // Word offsets of the step arrays inside arrays_ / staging_.
  struct ArrayOffsets {
    std::uint32_t ids = 0, positions = 0, row_slots = 0;                // [max_step_tokens]
    std::uint32_t decode_slots = 0, decode_lengths = 0, last_rows = 0;  // [max_chunks]
    std::uint32_t sampling = 0;      // [max_chunks] SamplingRow (8 words each)
    std::uint32_t logprob_rows = 0;  // [max_chunks] LogprobRow (4 words each)
    std::uint32_t adjust_rows = 0;   // [max_chunks] LogitAdjustRow (5 words each)
    std::uint32_t mask_rows = 0;     // [max_chunks] each chunk's token mask row, -1: none
    std::uint32_t words = 0;
  };

  CudaModel(ModelConfig config, ModelLimits limits) : Model(std::move(config), limits) {}
  Status init(const ModelWeights& weights, const CudaModelOptions& options);
  Status allocate_buffers();
  Status plan_decode_workspace();
  Result<void*> device_alloc(std::uint64_t bytes);

  Status check_batch(const StepBatch& batch, const StepOutput& out) const;
  Status check_view(const KvView& kv, const char* who) const;
  // sample: stage batch.sampling (else greedy rows), with the log-probability rows it asks
  // for (a kAll chunk's earlier rows in the prompt arrays). The logit-transform rows and
  // entries are staged whenever batch.sampling is given (as the CPU model applies them).
  void stage(const StepBatch& batch, bool sample);
  // Rows [count, rows) of the staged arrays as decode padding: token 0 at position 0 of
  // pad_slot, greedy sampling, no logit transforms.
  void stage_padding(std::uint32_t count, std::uint32_t rows, std::uint32_t pad_slot);
  Status run_step(const StepBatch& batch, const StepOutput& out);
  // Enqueues embedding -> layers -> norm -> lm_head (-> logit transforms) -> argmax (->
  // sampling -> log-probabilities of the last rows) reading the staged device arrays only.
  // decode_max_length: 0 plans each decode run from its longest sequence, else from this bound
  // (a graph's). adjust, logprobs, mask: launch the logit-transform, log-probability and
  // token-mask kernels (a graph always does; its rows say whether they act).
  Status enqueue_step(const StepBatch& batch, bool sample, std::uint32_t decode_max_length,
                      bool adjust, bool logprobs, bool mask);
  // Copies the first `rows` rows of the requested outputs; then the earlier rows of kAll
  // chunks (enqueue_prompt_logprobs) and the log-probability results; waits for the stream and
  // writes out.logprobs.
  Status finish_step(const StepBatch& batch, const StepOutput& out, std::uint32_t rows);
  // The stream synchronized, its wait counted in waits_.
  Status wait_for_step();
  // The final norm, lm_head and log-probabilities of the staged prompt rows, max_chunks rows
  // at a time through final_ and logits_ (after the step's own outputs were copied from them).
  Status enqueue_prompt_logprobs();
  // out.logprobs in chunk order from the results copied to the host.
  void write_logprobs(const StepBatch& batch, const StepOutput& out) const;
  // The staged arrays, then the staged logit-transform entries when the step has any.
  Status copy_arrays();
  // The graph a step replays, or null when it runs eagerly.
  const DecodeGraph* graph_for(const StepBatch& batch) const;
  Status replay(const DecodeGraph& graph, const StepBatch& batch, const StepOutput& out);
  Status capture_one(std::uint32_t rows, const DecodeGraphOptions& options, cudaGraphExec_t* exec);
  Status run_layer(std::uint32_t layer, const StepBatch& batch, std::uint32_t tokens,
                   std::uint32_t decode_max_length);
  // The SiLU MLP of normed_ into `out` (the dense MLP's, or a shared expert's): gate|up, SiLU-mul
  // (quantizing for an FP8 down projection), down. `input_quantized`: normed_'s e4m3 copy is
  // there for the gate|up projection.
  Status mlp(const void* gate_up, const float* gate_up_scales, const void* down,
             const float* down_scales, std::uint32_t inter, void* out, std::uint32_t tokens,
             bool input_quantized);
  // A sparse layer's feed-forward of normed_ into delta_: the router's GEMM, top k, the
  // permutation, the grouped expert GEMMs and the combine (with the shared expert), and with
  // the experts cached their residency between the top k and the permutation, all on the
  // device with no host synchronisation (capturable).
  Status sparse_mlp(std::uint32_t layer, std::uint32_t tokens);
  // The layer's q, k, v and the KV append: fused (one projection, RoPE in the append) or one
  // op at a time; either way q_ holds the rotated queries and the cache the new K and V.
  Status attention_inputs(std::uint32_t layer, const StepBatch& batch, std::uint32_t tokens);
  Status attention_inputs_fused(std::uint32_t layer, const StepBatch& batch, std::uint32_t tokens);
  AppendParams append_params(std::uint32_t layer, const StepBatch& batch,
                             std::uint32_t tokens) const;
  Status attention(std::uint32_t layer, const StepBatch& batch, std::uint32_t decode_max_length);
  // The device's copy of layer `layer`'s scales (kv_scale_table_).
  KvHeadScales head_scales(std::uint32_t layer) const;
  // A calibrating step's maxima of the layer's K and V (k_, v_ after RoPE) set its scales.
  Status calibrate_layer(std::uint32_t layer, std::uint32_t tokens);
  Status kv_scales_changed() override;
  // y[rows][out] = x[rows][in] . weight^T (+ bias), in the compute type: gemv_cuda for at most
  // kGemvRows rows when fused, else cuBLAS. With `scales` (an FP8 projection): linear_fp8.
  // `x_quantized`: x's rows already sit in xq_ (quantized_input's kernel wrote them).
  Status linear(const void* x, const void* weight, const float* scales, const void* bias, void* y,
                std::uint32_t rows, std::uint32_t in, std::uint32_t out, bool x_quantized = false);
  // An FP8 projection: fp8_gemv_cuda on x as it is for one row; else the activations
  // quantized into xq_ (unless x_quantized), then fp8_gemv_cuda's tensor-core form for at
  // most kFp8GemvRows rows, or cuBLASLt's FP8 GEMM (Fp8Matmul).
  Status linear_fp8(const void* x, const void* weight, const float* scales, const void* bias,
                    void* y, std::uint32_t rows, std::uint32_t in, std::uint32_t out,
                    bool x_quantized);
  // Where the kernel before an FP8 projection of `rows` rows (RMSNorm, SiLU-mul) writes its
  // rows quantized beside its own output, so the projection needs no quantizing launch: xq_
  // when the projections are FP8, fused and past one row; otherwise none (out null).
  QuantizedRows quantized_input(std::uint32_t rows) const;
  // y's rows set to the bias (nothing without one), for a GEMM that adds onto them (beta 1).
  Status lay_bias_under(const void* bias, void* y, std::uint32_t rows, std::uint32_t out);
  Status gemm(const void* x, const void* weight, void* y, cudaDataType y_type, float beta,
              std::uint32_t rows, std::uint32_t in, std::uint32_t out);
  bool gemv_shape(std::uint32_t rows, std::uint32_t in) const;
  // gemv_cuda with the bias (or null) added in the kernel.
  Status gemv(const void* x, const void* weight, const void* bias, void* y, bool y_float,
              float beta, std::uint32_t rows, std::uint32_t in, std::uint32_t out);
  // Byte offset of row `row` of a [..][width] activation in the compute type.
  void* row_of(void* base, std::uint64_t row, std::uint64_t width) const;

  int device_ = 0;
  bool fused_ = true;  // CudaModelOptions::fused
  DType compute_ = DType::kBf16;
  cudaDataType data_type_ = CUDA_R_16BF;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<DeviceWeights> weights_;
  std::unique_ptr<WeightRing> ring_;            // null unless layers are streamed
  std::vector<void*> allocations_;              // device memory besides the weights
  std::uint32_t* staging_ = nullptr;            // pinned host copy of arrays_
  std::uint32_t* prompt_staging_ = nullptr;     // pinned host copy of prompt_arrays_
  LogprobResult* logprob_host_ = nullptr;       // pinned host copy of logprob_results_
  LogitAdjustEntry* adjust_staging_ = nullptr;  // pinned host copy of adjustments_
  ArrayOffsets offsets_;

  // Device buffers (compute type unless said otherwise), sized for the limits.
  std::uint32_t* arrays_ = nullptr;
  float* inv_freq_ = nullptr;  // [head_dim / 2]
  void* x_ = nullptr;          // [tokens][hidden]: the residual stream
  void* normed_ = nullptr;     // [tokens][hidden]
  void* qkv_ = nullptr;        // [tokens][heads + 2 * kv_heads][head_dim]: the fused projection
  void* q_ = nullptr;          // [tokens][heads][head_dim]
  void* k_ = nullptr;          // [tokens][kv_heads][head_dim]
  void* v_ = nullptr;
  void* attn_ = nullptr;     // [tokens][heads][head_dim]
  void* delta_ = nullptr;    // [tokens][hidden]: o_proj / down_proj output
  void* gate_up_ = nullptr;  // [tokens][2 * intermediate]
  void* act_ = nullptr;      // [tokens][intermediate]
  // A mixture of experts' step buffers (null for a dense model): the router's logits [tokens]
  // [experts], each token's top-k ids and weights, the permutation (offsets [experts + 1], rows
  // and activations [capacity], slot_of_pair [tokens * k], active [1 + experts]), the weighted
  // expert outputs [tokens * k][hidden], the shared expert's output and gate logit.
  void* router_logits_ = nullptr;
  std::int32_t* moe_ids_ = nullptr;
  float* moe_weights_ = nullptr;
  std::uint32_t* moe_offsets_ = nullptr;
  std::uint32_t* moe_rows_ = nullptr;
  std::uint32_t* moe_slot_of_pair_ = nullptr;
  std::uint32_t* moe_active_ = nullptr;
  void* moe_act_ = nullptr;
  void* moe_pairs_ = nullptr;
  void* shared_out_ = nullptr;
  void* shared_logit_ = nullptr;
  void* final_ = nullptr;                     // [chunks][hidden]
  float* logits_ = nullptr;                   // [chunks][vocab], float32
  std::int32_t* argmax_ = nullptr;            // [chunks]
  ArgmaxPartial* argmax_partials_ = nullptr;  // [chunks][kArgmaxSplits]: null unless fused
  std::int32_t* sampled_ = nullptr;           // [chunks]
  // [max_chunks] each chunk's last row, then [max_step_tokens] the prompt rows (172 bytes a
  // token, next to the activations' kilobytes).
  LogprobResult* logprob_results_ = nullptr;
  // The prompt rows of a step with kAll chunks: [max_step_tokens] row indices, then
  // [max_step_tokens] LogprobRow; staged and copied only by such steps.
  std::uint32_t* prompt_arrays_ = nullptr;
  // [max_logit_adjustments] the step's LogitAdjustment entries, which the logit-transform rows
  // index; a fixed address, so a captured graph reads each replay's.
  LogitAdjustEntry* adjustments_ = nullptr;
  // [max_chunks][token_mask_words(vocab)] the step's token masks, copied only by a step that
  // has some; a fixed address, so a captured graph reads each replay's.
  std::uint32_t* token_masks_ = nullptr;
  bool masked_ = false;                         // the step being run masks some row
  std::span<const std::uint32_t> batch_masks_;  // the step's StepBatch::token_masks
  // [2][layers][kv_heads] float: every layer's fp8 KV scales per KV head (K, then V), which
  // the kernels read when they run (KvHeadScales), so a captured graph follows a new set.
  float* kv_scale_table_ = nullptr;
  float* calibration_max_ = nullptr;  // [2]: a calibrating step's maxima of one layer's K, V
  bool calibrating_ = false;          // this step measures the KV scales
  void* decode_workspace_ = nullptr;
  std::size_t decode_workspace_bytes_ = 0;
  void* cublas_workspace_ = nullptr;
  // An FP8 checkpoint's: the GEMM, a step's quantized activations [tokens][widest input] and
  // their scales (fp8_quantize_cuda's layout). Null unquantized.
  std::unique_ptr<Fp8Matmul> fp8_matmul_;
  void* xq_ = nullptr;
  float* xq_scales_ = nullptr;

  // Host scratch of a step, reserved at creation.
  std::vector<DecodeRun> runs_;
  std::vector<std::uint32_t> chunk_rows_;  // first row of each chunk
  bool logprob_chunks_ = false;            // some chunk asks for log-probabilities
  std::uint32_t prompt_rows_ = 0;          // earlier rows of kAll chunks, staged
  std::uint32_t adjust_entries_ = 0;       // logit-transform entries staged (0: none to apply)

  // Decode graphs, ascending by batch, and what they were captured for.
  std::vector<DecodeGraph> graphs_;
  KvView graph_view_;
  std::uint32_t graph_pad_slot_ = 0;
  std::uint32_t graph_max_length_ = 0;
  std::uint64_t replays_ = 0;
  std::uint64_t eager_steps_ = 0;
  ForwardWaits waits_;  // finish_step's synchronizations
};

}  // namespace kvvm::model::detail
