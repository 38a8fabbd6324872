// Model: the forward pass of a decoder-only transformer over a packed ragged batch, reading
// and writing K/V only through the attention kernels (include/kvvm/kernels/attention.h) on the
// KvView it is handed. It never sees the arena: whoever runs the model (the engine, `kvvm
// generate`) admits sequences, commits their windows and passes, per step, which slot each chunk
// writes and where it starts.
//
// A step packs every chunk's tokens into one [tokens][hidden] activation, so each projection
// is one GEMM per step: prefill chunks (many tokens of one sequence) and decode tokens (one
// token of a sequence) mix freely.
//
// Backends: CPU (float32 weights converted at load, OpenBLAS sgemm, the CPU attention; the
// host driver's arena) and CUDA (weights in bf16 / fp16 on the device, cuBLAS with fp32
// accumulation, the CUDA kernels; the CUDA driver's arena). Activation buffers are sized
// once from ModelLimits: a step allocates nothing.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/kv/kv_view.h"
#include "kvvm/model/config.h"
#include "kvvm/model/kv_scales.h"
#include "kvvm/model/sampling.h"
#include "kvvm/model/weight_memory.h"
#include "kvvm/model/weights.h"

namespace kvvm::model {

// One sequence's share of a step: `tokens` new tokens at positions [start, start + tokens),
// written into slot `slot` of the KvView. Its first `start` tokens are already in the cache.
struct Chunk {
  std::uint32_t slot = 0;
  std::uint32_t start = 0;
  std::uint32_t tokens = 0;
};

// Which rows of a chunk report log-probabilities (StepOutput::logprobs).
enum class LogprobRows : std::uint8_t {
  kNone,  // none
  kLast,  // the last row: the token drawn after the chunk
  kAll,   // every row: row j scores the chunk's token j + 1, the last row the drawn token
};

// How the token after a chunk's last one is drawn: sample_token(logits, params, counter).
struct ChunkSampling {
  SamplingParams params;
  std::uint64_t counter = 0;  // the request's output index of the token drawn
  // Log-probabilities of this chunk's rows (StepOutput::logprobs): none, the last row only
  // (the token drawn after the chunk), or every row (prompt log-probabilities: row j scores
  // the chunk's token j + 1, the last row the drawn token).
  LogprobRows logprob_rows = LogprobRows::kNone;
  std::uint32_t top_logprobs = 0;  // alternatives per row, <= kMaxTopLogprobs
  // The token the chunk's last row scores; -1: the one drawn after it. A chunk that ends
  // mid-prompt scores the next prompt token, so prompt log-probabilities do not depend on
  // where the prefill was cut.
  std::int32_t last_target = -1;
  // The draw's logit transforms: StepBatch::adjustments[adjust_begin, + adjust_count), applied
  // with params' penalties to the last row before it samples (and before its log-probabilities
  // and the logits returned).
  std::uint32_t adjust_begin = 0;
  std::uint32_t adjust_count = 0;
  // The draw's token mask (structured output): row `mask_row` of StepBatch::token_masks, whose
  // tokens with a 0 bit get -inf after the transforms (the draw, the argmax, the
  // log-probabilities and the logits returned read the masked row); -1: none.
  std::int32_t mask_row = -1;
};

// The 32-bit words of one token mask row: bit t of word t / 32 is token t.
inline std::size_t token_mask_words(std::uint32_t vocab) { return (std::size_t{vocab} + 31) / 32; }

struct StepBatch {
  std::span<const std::int32_t> token_ids;  // every chunk's tokens, packed in chunk order
  std::span<const Chunk> chunks;
  KvView kv;  // its element type must be one the backend's attention accepts
  // Empty, or one per chunk: needed for StepOutput::sampled. REQUIRES check_sampling passed.
  std::span<const ChunkSampling> sampling;
  // Every chunk's logit transforms, each chunk's ids ascending and distinct; at most
  // ModelLimits::max_logit_adjustments.
  std::span<const LogitAdjustment> adjustments = {};
  // Token masks, token_mask_words(vocab_size) words a row, at most ModelLimits::max_chunks rows;
  // chunks name theirs by ChunkSampling::mask_row. A row must allow at least one token.
  std::span<const std::uint32_t> token_masks = {};
};

// One row's log-probabilities (sampling.h says what they are: row_logprobs).
struct RowLogprobs {
  float logprob = 0;         // of the row's target token
  std::int32_t target = -1;  // that token: the next token in the chunk, or the one drawn after
                             // it (last row)
  std::uint32_t top = 0;     // alternatives filled below
  std::array<std::int32_t, kMaxTopLogprobs> top_ids{};
  std::array<float, kMaxTopLogprobs> top_logprobs{};
};

// What a step returns, for the last token of each chunk (host memory; any may be null).
struct StepOutput {
  float* logits = nullptr;         // [chunks][vocab_size]
  std::int32_t* argmax = nullptr;  // [chunks]: the greedy token (lowest id among equals)
  // [chunks]: the token drawn with batch.sampling[c] (on the device for CUDA, from the same
  // counter-based uniform as the CPU). InvalidArgument when batch.sampling is empty.
  std::int32_t* sampled = nullptr;
  // Log-probability rows, for the chunks whose sampling asks (batch.sampling non-empty), in
  // chunk order: one per row of a kAll chunk, one for a kLast chunk, none for kNone. Count them
  // with logprob_row_count(batch). The last row of a chunk scores its last_target, or when that
  // is -1 the token in sampled[c] (so `sampled` must be non-null when any chunk asks:
  // InvalidArgument otherwise). Null while a chunk asks: InvalidArgument.
  RowLogprobs* logprobs = nullptr;
};

// The number of RowLogprobs a step with this batch fills.
std::size_t logprob_row_count(const StepBatch& batch);

// CUDA graphs of decode-only steps. A step whose chunks are all single tokens, at most the
// largest bucket of them, on the captured KvView, replays the graph of the smallest bucket
// that holds it: the step's arrays (ids, positions, slots, lengths, sampling) are copied into
// the graph's static buffers first, and the rows past the step's own chunks are padding that
// write token 0's K / V at position 0 of `pad_slot` (which the caller keeps committed and
// never reads) and whose outputs are dropped. Lengths are read on the device, so one graph
// serves every length up to `max_length`.
struct DecodeGraphOptions {
  std::vector<std::uint32_t> batch_sizes;  // ascending, each in [1, limits().max_chunks]
  KvView kv;                               // the view every replay uses
  std::uint32_t pad_slot = 0;
  std::uint32_t max_length = 0;  // longest sequence while the graphs live (decode split plan)
};

struct GraphStats {
  std::uint64_t graphs = 0;       // captured and alive
  std::uint64_t replays = 0;      // steps that ran as a graph replay
  std::uint64_t eager_steps = 0;  // steps that ran kernel by kernel
};

// The host's time waiting for the device at the end of steps, summed since the model was made
// (the steady clock): with the time of forward() itself, it splits a step into the host's
// work (staging, launches) and the device's tail the host only waits for.
struct ForwardWaits {
  std::uint64_t steps = 0;  // forwards that waited
  double seconds = 0;
};

struct ModelLimits {
  std::uint32_t max_step_tokens = 512;  // tokens of one step, all chunks together
  std::uint32_t max_chunks = 64;        // chunks of one step
  // LogitAdjustment entries of one step (CUDA stages them into a buffer of this size); at
  // least a vocabulary's worth, so one chunk's transforms always fit.
  std::uint32_t max_logit_adjustments = 1u << 18;
};

enum class Backend : std::uint8_t { kCpu, kCuda };
std::string_view to_string(Backend backend);

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }
  const ModelLimits& limits() const { return limits_; }
  virtual Backend backend() const = 0;

  // Runs one step. InvalidArgument (nothing written) for a batch beyond the limits, a token
  // id outside the vocabulary, chunks whose token counts do not sum to token_ids.size(), a
  // position beyond max_position_embeddings, or a KvView whose geometry is not the model's.
  // REQUIRES: each chunk's slot has windows committed through start + tokens; on CUDA the
  // step is enqueued on the model's stream and the outputs are ready when forward returns.
  virtual Status forward(const StepBatch& batch, const StepOutput& out) = 0;

  // Captures one decode graph per bucket (CUDA; Unavailable on the CPU backend, which has no
  // launches to save). REQUIRES: the caller holds its arena's capture guard (nothing maps or
  // unmaps meanwhile) and keeps `pad_slot`'s first token committed while the graphs live.
  // InvalidArgument naming the value for a bad bucket, view or bound; on failure no graph is
  // kept and steps run eagerly.
  virtual Status capture_decode_graphs(const DecodeGraphOptions& options);
  // Drops every graph; later steps run eagerly.
  virtual void release_decode_graphs() {}
  virtual GraphStats graph_stats() const { return {}; }
  // The CPU backend computes in forward() itself and never waits: none.
  virtual ForwardWaits forward_waits() const { return {}; }

  // Where the weights live and what they hold (kvvm/model/weight_memory.h).
  virtual WeightStats weight_stats() const { return {}; }

  // The scales an fp8 KvView is written and read with (kvvm/model/kv_scales.h): the
  // checkpoint's, else ones. A view of another element type ignores them.
  const KvScales& kv_scales() const { return kv_scales_; }
  // Replaces them. InvalidArgument naming the layer for a scale that is not finite and
  // positive or a count other than one per layer (or per layer and KV head); the old ones stay
  // then. REQUIRES: no step is running and no fp8 K / V written with the old ones is read
  // again. (CUDA decode graphs read the scales from device memory at each replay, so they
  // stay valid.)
  Status set_kv_scales(KvScales scales);

  // Asks for a calibration (`--kv-scales calibrate`): the scales become ones, and the next step
  // that starts a sequence (a chunk at position 0) measures each layer's largest |K| and |V|
  // over the step's rows, after RoPE and before the layer's append, and sets that layer's
  // scales to them / kCalibrationRange (1.0 where every value is zero or one is not finite);
  // from then on the source is kCalibrated and the scales stay. The step's own K / V are
  // written with its layer's calibrated scales. REQUIRES: what set_kv_scales requires.
  Status calibrate_kv_scales();
  bool kv_calibration_pending() const { return calibration_pending_; }

 protected:
  Model(ModelConfig config, ModelLimits limits)
      : config_(std::move(config)), limits_(limits), kv_scales_(KvScales::ones(config_.layers)) {}

  // For a backend's step: whether it calibrates (one is pending and a chunk starts a sequence).
  bool calibrates(const StepBatch& batch) const;
  // The step's maxima of layer `layer`'s K and V: sets the layer's scales.
  Status set_calibrated_layer(std::uint32_t layer, float k_max, float v_max);
  // The calibrating step ran every layer: the scales are final.
  void end_calibration();
  // After the scales changed (CUDA keeps a device copy the kernels read); set_kv_scales and
  // the calibration fail with its error.
  virtual Status kv_scales_changed() { return Status::Ok(); }

 private:
  ModelConfig config_;
  ModelLimits limits_;
  KvScales kv_scales_;
  bool calibration_pending_ = false;
};

struct CpuModelOptions {
  ModelLimits limits;
  unsigned threads = 0;   // 0: the hardware's
  WeightOptions weights;  // a lent driver must be a host one
};
// Converts the weights to float32 into their store (they may be dropped after this returns);
// with weights.format kDummy, `weights` is not read. The KV scales are the checkpoint's
// (ModelWeights::kv_scales) where it has them.
Result<std::unique_ptr<Model>> make_cpu_model(const ModelConfig& config,
                                              const ModelWeights& weights,
                                              const CpuModelOptions& options);

struct CudaModelOptions {
  ModelLimits limits;
  void* stream = nullptr;  // cudaStream_t the steps run on; null: a stream of the model's own
  // Compute type of weights and activations on the device: kBf16 or kFp16; kUnset: the
  // checkpoint's (an F32 checkpoint runs in bf16).
  DType compute = DType::kUnset;
  WeightOptions weights;  // a lent driver must be a CUDA one, of the current device
  // The step's fused kernels: one q|k|v projection, RoPE fused with the KV append, a GEMV for
  // batches of up to kGemvRows rows, a multi-block argmax. false: one kernel per op and
  // cuBLAS for every projection (the path the fused one is tested and measured against).
  bool fused = true;
};
// Copies the weights to the device (with weights.format kDummy draws them there; `weights` is
// not read, and the compute type is `compute`, else the config's). Unavailable (saying why) without
// a CUDA device, the CUDA kernels or cuBLAS.
Result<std::unique_ptr<Model>> make_cuda_model(const ModelConfig& config,
                                               const ModelWeights& weights,
                                               const CudaModelOptions& options);

}  // namespace kvvm::model
