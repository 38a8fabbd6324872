// The CUDA kernels of a transformer's forward pass besides attention (attention.h) and the
// projections (cuBLAS GEMMs, and a GEMV for small batches): embedding gather, RMSNorm fused with
// the residual add, the per-head RMSNorm of q and k (Qwen3), rotary position embedding,
// SiLU-and-multiply, bias broadcast, logit transforms (penalties, logit_bias, bans), argmax,
// sampling and log-probabilities.
//
// Why each kernel rounds where it does: the parity oracle compares against Hugging Face
// transformers running in bf16 / fp16, where every elementwise torch op computes in float32
// and rounds its result to the tensor's type. Each kernel computes in float32 and rounds at
// the same points (named on each params struct), so the two agree to the last bit wherever
// the order of a sum does not matter.
//
// Conventions shared with attention.h: pointers are device addresses, launches are
// asynchronous on `stream` (a cudaStream_t; null: the legacy stream) and capturable in a CUDA
// graph; per-token data (ids, positions, row indices) is read from device memory when the
// kernel runs. Element types: fp16 and bf16 (`element`), row-major dense tensors. A call with
// zero rows launches nothing. A build without nvcc answers Unavailable for every call.
#pragma once

#include <cstdint>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"
#include "kvvm/kernels/fp8_kernels.h"

namespace kvvm {

// Whether this build has the kernels (built with nvcc).
bool model_kernels_built();

// Whether a decode step's kernels launch overlapping the kernel before them (programmatic
// dependent launch, sm_90: a kernel's blocks start under its predecessor's tail and wait for
// it before reading its output). On by default; off launches every kernel in plain stream
// order, to measure what the overlap saves (`kvvm bench engine --in-order-launches`). Read at
// each launch, so a graph keeps the order it was captured with. A no-op without the kernels.
void set_overlapped_launches(bool on);
bool overlapped_launches();

// out[t] = table[ids[t]]. An id outside [0, vocab) gives a row of zeros (the model checks ids
// on the host; the kernel never reads outside the table).
struct EmbeddingParams {
  DType element = DType::kUnset;  // of table and out
  std::uint32_t tokens = 0;
  std::uint32_t hidden = 0;
  std::uint32_t vocab = 0;
  const std::int32_t* ids = nullptr;  // [tokens]
  const void* table = nullptr;        // [vocab][hidden]
  void* out = nullptr;                // [tokens][hidden]
};
Status embedding_cuda(const EmbeddingParams& params, void* stream);

// The rows a kernel writes, also quantized for an FP8 projection that reads them next: exactly
// what fp8_quantize_cuda (kvvm/kernels/fp8_kernels.h) writes from them, same layout and bits, with
// rows [rows, stride) zeros of scale 1, so the separate quantization's launch and its read of
// the rows vanish. `out` null: nothing quantized.
struct QuantizedRows {
  Fp8Scales kind = Fp8Scales::kBlock128;
  std::uint32_t stride = 0;  // at least rows: fp8_padded_rows(rows)
  void* out = nullptr;       // e4m3 [stride][width], 16-byte aligned
  float* scales = nullptr;   // as fp8_quantize_cuda's
};

// For each output row r, with s = row_index ? row_index[r] : r:
//   when `add`: x[s] = round(x[s] + add[s])            (the residual add, written back)
//   out[r] = round(weight * round(x[s] * rsqrt(mean(x[s]^2) + eps)))
// as Hugging Face's LlamaRMSNorm: float32 variance, the normalised row cast to the element
// type before the weight multiplies it. row_index lets the final norm read only the last
// token of each sequence (a gather fused into the norm); its entries must be distinct.
struct RmsNormParams {
  DType element = DType::kUnset;
  std::uint32_t rows = 0;
  std::uint32_t hidden = 0;
  float eps = 1e-6f;
  void* x = nullptr;                         // [..][hidden]: the residual stream
  const void* add = nullptr;                 // [..][hidden] or null
  const std::uint32_t* row_index = nullptr;  // [rows] or null
  const void* weight = nullptr;              // [hidden]
  void* out = nullptr;                       // [rows][hidden]
  QuantizedRows quantized;                   // out's rows in e4m3 too; not with row_index
};
Status rmsnorm_cuda(const RmsNormParams& params, void* stream);

// Rotary position embedding in place, rotate_half form (Llama, Qwen2): for i < d/2, with
// angle = float(positions[t]) * inv_freq[i] in float32 and c, s = cos, sin of it rounded to
// the element type (HF casts its cos / sin tables to the activations' type):
//   x[i]       = round(round(x[i] * c)       + round(-x[i + d/2] * s))
//   x[i + d/2] = round(round(x[i + d/2] * c) + round(x[i] * s))
// on every head of q and of k. k may be null (q only).
struct RopeParams {
  DType element = DType::kUnset;
  std::uint32_t tokens = 0;
  std::uint32_t q_heads = 0;
  std::uint32_t k_heads = 0;
  std::uint32_t head_dim = 0;                // even
  void* q = nullptr;                         // [tokens][q_heads][head_dim]
  void* k = nullptr;                         // [tokens][k_heads][head_dim] or null
  const std::uint32_t* positions = nullptr;  // [tokens]
  const float* inv_freq = nullptr;           // [head_dim / 2]
};
Status rope_cuda(const RopeParams& params, void* stream);

// Per-head RMSNorm in place (Qwen3's q_norm / k_norm, before RoPE). For each token t and head
// h < q_heads + kv_heads, the row x_h = x + t * token_stride + h * head_dim (in elements) becomes
//   x_h[i] = round(w[i] * round(x_h[i] * rsqrt(mean(x_h^2) + eps)))
// with w = q_weight for h < q_heads and k_weight after: Hugging Face's Qwen3RMSNorm, rounded as
// RmsNormParams is. What lies past a token's heads (v in a fused q|k|v row) is not touched, so
// the fused projection's [tokens][q_heads + 2 kv_heads][head_dim] takes one call, and separate
// q and k buffers one each (kv_heads 0, then q_heads 0). One warp per row.
inline constexpr std::uint32_t kMaxHeadNormDim = 256;
struct HeadRmsNormParams {
  DType element = DType::kUnset;
  std::uint32_t tokens = 0;
  std::uint32_t q_heads = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;      // even, at most kMaxHeadNormDim
  std::uint64_t token_stride = 0;  // elements; at least (q_heads + kv_heads) * head_dim
  float eps = 1e-6f;
  void* x = nullptr;               // [tokens][token_stride]
  const void* q_weight = nullptr;  // [head_dim]; read when q_heads > 0
  const void* k_weight = nullptr;  // [head_dim]; read when kv_heads > 0
};
// head_rmsnorm_cuda's checks, in every build (no CUDA call): InvalidArgument naming the value.
Status check_head_rmsnorm(const HeadRmsNormParams& params);
Status head_rmsnorm_cuda(const HeadRmsNormParams& params, void* stream);

// out[r][i] = round(round(silu(gate)) * up) with gate = gate_up[r][i], up = gate_up[r][inter + i]
// (Hugging Face: act_fn(gate_proj(x)) * up_proj(x), both tensors in the element type).
struct SiluMulParams {
  DType element = DType::kUnset;
  std::uint32_t rows = 0;
  std::uint32_t inter = 0;
  const void* gate_up = nullptr;  // [rows][2 * inter]
  void* out = nullptr;            // [rows][inter]
  QuantizedRows quantized;        // out's rows in e4m3 too
};
Status silu_mul_cuda(const SiluMulParams& params, void* stream);

// The largest magnitude of `count` elements, raised into out[0] (float32, device memory):
// out[0] = max(out[0], max_i |x[i]|), a NaN kept as NaN (its bits order above every finite
// magnitude's). An fp8 KV calibration's maxima of one layer's K or V; out[0] starts at 0.
struct AbsMaxParams {
  DType element = DType::kUnset;
  std::uint64_t count = 0;
  const void* x = nullptr;
  float* out = nullptr;
};
Status absmax_cuda(const AbsMaxParams& params, void* stream);

// out[r] = row for every r: a bias laid under a GEMM's output, which then accumulates onto it
// with beta = 1, so bias and product are summed in float32 and rounded once (as a Linear with
// a bias is in torch).
struct BroadcastRowsParams {
  DType element = DType::kUnset;
  std::uint32_t rows = 0;
  std::uint32_t cols = 0;
  const void* row = nullptr;  // [cols]
  void* out = nullptr;        // [rows][cols]
};
Status broadcast_rows_cuda(const BroadcastRowsParams& params, void* stream);

// out[i] = dummy_value(seed, tensor, i, scale) rounded to `element` (fp16, bf16, fp32, or
// fp8 e4m3: an FP8 projection) for i < count; scale 0 with `constant` set fills `constant`
// instead (norm weights of 1). The dummy load format's fill (kvvm/model/weight_memory.h):
// weights drawn where they live, no file read.
struct DummyFillParams {
  DType element = DType::kUnset;
  std::uint64_t count = 0;
  std::uint64_t seed = 0;
  std::uint32_t tensor = 0;
  float scale = 0;
  float constant = 0;
  void* out = nullptr;
};
Status dummy_fill_cuda(const DummyFillParams& params, void* stream);

// One row's logit transforms as the device reads them: its sequence's penalties
// (kvvm::model::SamplingParams) and its range of the step's entries. 32-bit words only, staged
// with a step's other arrays, so a captured step reads them at every replay. count 0: the row
// is left as it is.
struct LogitAdjustRow {
  float presence_penalty = 0;
  float frequency_penalty = 0;
  float repetition_penalty = 1;
  std::uint32_t begin = 0;  // the row's first entry in LogitAdjustParams::entries
  std::uint32_t count = 0;
};
static_assert(sizeof(LogitAdjustRow) == 20, "five 32-bit words");

// One token's transform, laid out as kvvm::model::LogitAdjustment (the model copies a step's
// entries as they are).
struct LogitAdjustEntry {
  std::int32_t id;
  std::uint32_t count;      // times in the output so far
  std::uint32_t in_prompt;  // 1: in the prompt
  float bias;               // -inf bans the token
};
static_assert(sizeof(LogitAdjustEntry) == 16, "four 32-bit words");

// For each row r and each entry a of entries[begin, begin + count): logits[r][a.id] =
// kvvm::model::adjusted_logit(logits[r][a.id], penalties, a), bit for bit (the same float32
// operations in the same order, none fused): l += bias; if repetition != 1 and (count > 0 or
// in_prompt), l = l > 0 ? l / r : l * r; l -= frequency * count + (count > 0 ? presence : 0).
// A row's ids must be distinct (one thread per entry, no atomics); an id outside [0, vocab) is
// skipped. One block per row: a row with count 0 returns at once, so a captured step launches
// it whether or not a row has transforms.
struct LogitAdjustParams {
  std::uint32_t rows = 0;
  std::uint32_t vocab = 0;
  float* logits = nullptr;                      // [rows][vocab], in place
  const LogitAdjustRow* rows_params = nullptr;  // [rows]
  const LogitAdjustEntry* entries = nullptr;    // read at [begin, begin + count) of each row
};
Status logit_adjust_cuda(const LogitAdjustParams& params, void* stream);

// Token masks (structured output): in each row r with mask_rows[r] >= 0, every logit whose bit in
// row mask_rows[r] of `masks` (words 32-bit words a row, bit t % 32 of word t / 32) is 0 becomes
// -inf, in place, after the logit transforms and before argmax, sampling and log-probabilities.
// A row of -1 is left as it is (and costs one read).
struct TokenMaskParams {
  std::uint32_t rows = 0;
  std::uint32_t vocab = 0;
  std::uint32_t words = 0;                  // per mask row: (vocab + 31) / 32
  float* logits = nullptr;                  // [rows][vocab], in place
  const std::int32_t* mask_rows = nullptr;  // [rows]
  const std::uint32_t* masks = nullptr;     // [mask rows][words]
};
Status token_mask_cuda(const TokenMaskParams& params, void* stream);

// out[r] = the index of the largest of logits[r][0, vocab), the lowest index among equals;
// NaN never wins (a row of NaN gives 0). With a workspace each row is split over up to
// kArgmaxSplits blocks (a second, small kernel picks among their bests): one block alone
// streams a 150K-entry row at a fraction of the memory's rate. Without one, one block a row.
// Either way the answer is the same index.
inline constexpr std::uint32_t kArgmaxSplits = 64;
// An entry of the workspace: one split's best value and its index.
struct ArgmaxPartial {
  float value;
  std::uint32_t index;  // 0xffffffff: the split saw no value that is not NaN
};
struct ArgmaxParams {
  std::uint32_t rows = 0;
  std::uint32_t vocab = 0;
  const float* logits = nullptr;       // [rows][vocab]
  std::int32_t* out = nullptr;         // [rows]
  ArgmaxPartial* workspace = nullptr;  // [rows][kArgmaxSplits] or null
};
Status argmax_cuda(const ArgmaxParams& params, void* stream);

// y[r][n] = round(sum over k of x[r][k] * weight[n][k] + b) with b = bias[n] when given, else
// beta * y[r][n] (bias and beta = 1 over a broadcast bias give the same bits) for the few rows of a
// small batch's decode step (rows <= kGemvMaxRows): the GEMM shape where a library GEMM does
// not stream the weights at the memory's rate. Float32 accumulation; y in the element type
// (rounded once, as a GEMM with float32 compute rounds) or float32 (`y_float`: logits). The
// sum of each output runs in an order fixed by (in, out) alone, never by `rows`, so a row's
// result is the same bits whatever the batch beside it. REQUIRES: `in` a multiple of 8 and
// x, weight 16-byte aligned (16-byte loads).
inline constexpr std::uint32_t kGemvMaxRows = 16;
struct GemvParams {
  DType element = DType::kUnset;  // of x, weight (and y unless y_float)
  std::uint32_t rows = 0;
  std::uint32_t in = 0;
  std::uint32_t out = 0;
  float beta = 0;                // 1: add to what y holds (a bias broadcast before)
  const void* bias = nullptr;    // [out] in the element type, or null (then beta applies)
  bool y_float = false;          // y is float32
  const void* x = nullptr;       // [rows][in]
  const void* weight = nullptr;  // [out][in]
  void* y = nullptr;             // [rows][out]
  // For measuring; 0 lets the kernel choose. Warps per output: 1, 2, 4 or 8 (chosen from
  // (in, out) alone). Weight vectors a lane has in flight: 4, or 8 for at most 2 rows (chosen:
  // 8 for at most 2 rows, else 4).
  std::uint32_t split = 0;
  std::uint32_t unroll = 0;
};
Status gemv_cuda(const GemvParams& params, void* stream);

// One row's sampling parameters as the device reads them: 32-bit words only, so the model
// stages them with a step's other arrays (one pinned block, one copy). The seed and counter
// are split into low and high halves.
struct SamplingRow {
  float temperature = 0;  // 0: greedy
  std::uint32_t top_k = 0;
  float top_p = 1;
  std::uint32_t seed_low = 0, seed_high = 0;
  std::uint32_t counter_low = 0, counter_high = 0;
  float min_p = 0;  // 0: off
};
static_assert(sizeof(SamplingRow) == 32, "eight 32-bit words");

// out[r] = the token kvvm::model::sample_token (include/kvvm/model/sampling.h) draws from
// logits[r][0, vocab) with rows[r]: greedy (the argmax above) for temperature 0 or top_k 1,
// else weights exp((l - max) / T) over the non-NaN logits, top-k, then top-p (the smallest
// prefix, in descending order with the lower id first among equals, whose mass reaches p),
// then the inverse CDF at counter_uniform(seed, counter) in double; in id order when neither
// truncation applies, in that descending order when one does. The chosen token is the CPU's
// except where float rounding of near-equal cumulative masses decides (sums run in another
// order). One block per row; no sort: radix selections over the logits' bits. With `argmax`
// (argmax_cuda's answer for the same logits) a greedy row copies it and reads no logit: the
// block would otherwise scan the whole row alone (117 us for 128K entries on an H200).
struct SampleParams {
  std::uint32_t rows = 0;
  std::uint32_t vocab = 0;
  const float* logits = nullptr;             // [rows][vocab]
  const SamplingRow* rows_params = nullptr;  // [rows]
  const std::int32_t* argmax = nullptr;      // [rows] or null
  std::int32_t* out = nullptr;               // [rows]
};
Status sample_cuda(const SampleParams& params, void* stream);

// The most alternatives logprobs_cuda lists per row (kvvm::model::kMaxTopLogprobs).
inline constexpr std::uint32_t kMaxLogprobTop = 20;
// LogprobRow::target of a row that scores the token the sampling kernel drew for it.
inline constexpr std::int32_t kLogprobSampled = -1;

// One row's log-probability request as the device reads it: 32-bit words only, staged with a
// step's other arrays, so a captured step serves rows that ask and rows that do not.
struct LogprobRow {
  std::uint32_t active = 0;  // 0: the row is skipped (its result is not written)
  float temperature = 0;     // > 0: log_softmax(logits / temperature); else of the logits
  std::int32_t target = kLogprobSampled;  // the token scored; kLogprobSampled: sampled[r]
  std::uint32_t top = 0;                  // alternatives listed (above kMaxLogprobTop: that)
};
static_assert(sizeof(LogprobRow) == 16, "four 32-bit words");

// One row's result, laid out as kvvm::model::RowLogprobs (the model copies it as it is).
struct LogprobResult {
  float logprob;        // of target
  std::int32_t target;  // the token scored (sampled[r] resolved)
  std::uint32_t top;    // entries of top_ids / top_logprobs written
  std::int32_t top_ids[kMaxLogprobTop];
  float top_logprobs[kMaxLogprobTop];
};

// For each active row r: the log-probability of its target and the `top` most likely ids in
// descending order (the lowest id first among equal logits) with theirs, where
// logprob(i) = (l[i] - max) / T - log(sum over non-NaN j of exp((l[j] - max) / T)) in float32
// (T = 1 when temperature is 0): kvvm::model::row_logprobs to float rounding. NaN logits are
// left out and never listed (`top` counts what was); a target outside [0, vocab) scores NaN.
// One block per row, one read of the row: each warp keeps its best `top` in registers as it
// streams its share, and the warps' lists are merged pairwise; no sort of the vocabulary.
struct LogprobsParams {
  std::uint32_t rows = 0;
  std::uint32_t vocab = 0;
  const float* logits = nullptr;            // [rows][vocab]
  const LogprobRow* rows_params = nullptr;  // [rows]
  const std::int32_t* sampled = nullptr;    // [rows]; read by kLogprobSampled rows only
  LogprobResult* out = nullptr;             // [rows]
};
Status logprobs_cuda(const LogprobsParams& params, void* stream);

}  // namespace kvvm
