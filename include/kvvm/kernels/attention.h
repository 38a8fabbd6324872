// Attention over the flat KV cache: append, decode and causal prefill.
//
// Why these functions see only a KvView, slot ids and lengths: the arena, its windows and its
// driver live in other layers (docs/ARCHITECTURE.md "Layers"), and a KvView's strides address every
// layout, so one kernel per operation serves head-major, seq-major and token-major alike. A kernel
// never reads a token at or beyond its sequence's live length: the windows there may be unmapped (a
// read would fault) or hold an earlier occupant's bytes.
//
// Three implementations of each operation, with one parameter struct:
//   - CUDA (fp16, bf16; head dim 64 or 128; fp32 accumulation): pointers are device
//     addresses, launches are asynchronous on `stream` (a cudaStream_t; null: the legacy
//     stream) and capturable in a CUDA graph. Lengths and per-row positions are read from
//     device memory when the kernel runs, so a captured graph keeps working as sequences grow.
//   - CPU float32, multithreaded (the host backend's path): pointers are host addresses.
//   - CPU float64 reference (tests): pointers are host addresses; outputs are doubles.
// Tensors are dense, row-major, in the activation type (the view's element type unless the
// cache is fp8, which holds e4m3 and takes its activations in fp16, bf16 or fp32):
//   q, out: [rows][qo_heads][head_dim]; new k, v: [rows][kv_heads][head_dim].
// Query head h reads KV head h / (qo_heads / kv_heads) (grouped-query attention).
//
// An fp8 (e4m3) cache stores value / scale with one scale for K and one for V per call (a
// layer), rounded to nearest even and saturated at +-448, so a finite value never becomes NaN;
// readers multiply back. The scales are folded into the score and the output, never into
// the stored bytes' conversion, so each element is dequantized exactly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvvm/base/status.h"
#include "kvvm/kv/kv_view.h"

namespace kvvm {

// Per-KV-head scales of an fp8 cache (checkpoints that calibrate each head): k[h] and v[h]
// replace k_scale and v_scale for KV head h. Both or neither; [kv_heads] floats each, finite
// and positive, in host memory for the CPU paths and device memory for CUDA, where they are
// read when the kernel runs (a captured graph reads the values of each replay). Ignored by a
// bf16 / fp16 / fp32 cache.
struct KvHeadScales {
  const float* k = nullptr;
  const float* v = nullptr;
};

// Writes the K and V of `tokens` new rows into their slots. Row i goes to slot
// row_slots[i] at position row_positions[i] when those arrays are given (a decode step: one
// token for each sequence of a batch), else to slot `slot` at position start + i (a prefill
// chunk). REQUIRES: the windows under every target position are committed read-write.
struct AppendParams {
  KvView view;
  DType activations = DType::kUnset;  // k, v; kUnset: the view's element type
  float k_scale = 1.0f;               // fp8 caches: stored = e4m3(k / k_scale)
  float v_scale = 1.0f;
  KvHeadScales head_scales;  // fp8 caches: per-head scales replacing the two above
  std::uint32_t layer = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t tokens = 0;
  const void* k = nullptr;                       // [tokens][kv_heads][head_dim]
  const void* v = nullptr;                       // [tokens][kv_heads][head_dim]
  const std::uint32_t* row_slots = nullptr;      // [tokens] or null
  const std::uint32_t* row_positions = nullptr;  // [tokens] or null (both or neither)
  std::uint32_t slot = 0;                        // without the arrays
  std::uint32_t start = 0;                       // without the arrays
};

// append_kv_cuda with the rotary position embedding fused in (a step's hot path: one kernel
// where rope_cuda, model_kernels.h, and the append were two). Each token's row of a fused
// projection, qkv[t] = [qo_heads q heads | kv_heads k heads | kv_heads v heads] x head_dim in
// the activations' type, gives q rotated into q_out and k rotated and v stored in the cache,
// bit for bit what rope_cuda on q and k followed by append_kv_cuda store (same rounding; an
// fp8 cache: the same scales). Positions: append.row_positions, else append.start + t.
// append.k / append.v are not read (null). CUDA only (the CPU model runs the two ops).
struct RopeAppendParams {
  AppendParams append;
  std::uint32_t qo_heads = 0;
  const void* qkv = nullptr;        // [tokens][(qo_heads + 2 * kv_heads) * head_dim]
  void* q_out = nullptr;            // [tokens][qo_heads][head_dim]
  const float* inv_freq = nullptr;  // [head_dim / 2], as RopeParams
  // Dense copies of the rotated k and of v ([tokens][kv_heads][head_dim]) or null; with
  // `cache` false only q and these are written: a step that must see K and V (its scales'
  // measurement) before they are stored.
  void* k_out = nullptr;
  void* v_out = nullptr;
  bool cache = true;
};

// One query token per sequence against its first lengths[b] tokens. A length of 0 gives an
// output of zeros.
struct DecodeParams {
  KvView view;
  DType activations = DType::kUnset;  // q, out; kUnset: the view's element type
  float k_scale = 1.0f;               // fp8 caches: K = stored * k_scale
  float v_scale = 1.0f;
  KvHeadScales head_scales;  // fp8 caches: per-head scales replacing the two above
  std::uint32_t layer = 0;
  std::uint32_t qo_heads = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t batch = 0;
  float sm_scale = 0;                      // 0: 1 / sqrt(head_dim)
  const void* q = nullptr;                 // [batch][qo_heads][head_dim]
  const std::uint32_t* slots = nullptr;    // [batch]
  const std::uint32_t* lengths = nullptr;  // [batch], read when the kernel runs
  // An upper bound of every length, for planning the split over the sequence (CUDA): for a
  // captured graph, the longest any sequence will be while the graph is replayed. A length
  // above it is clamped to it (CUDA) or refused (CPU).
  std::uint32_t max_length = 0;
  std::uint32_t chunk_tokens = 0;  // CUDA split size; 0: planned from the device and shape
  void* out = nullptr;             // [batch][qo_heads][head_dim]
};

// Causal attention of a prompt chunk: query row i sits at position start + i and reads the
// sequence's tokens [0, start + i], earlier chunks included. REQUIRES: the chunk's own K and
// V were appended first.
struct PrefillParams {
  KvView view;
  DType activations = DType::kUnset;  // q, out; kUnset: the view's element type
  float k_scale = 1.0f;               // fp8 caches: K = stored * k_scale
  float v_scale = 1.0f;
  KvHeadScales head_scales;  // fp8 caches: per-head scales replacing the two above
  std::uint32_t layer = 0;
  std::uint32_t qo_heads = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t slot = 0;
  std::uint32_t start = 0;
  std::uint32_t tokens = 0;
  float sm_scale = 0;       // 0: 1 / sqrt(head_dim)
  const void* q = nullptr;  // [tokens][qo_heads][head_dim]
  void* out = nullptr;      // [tokens][qo_heads][head_dim]
};

// ---- Checks shared by every implementation (InvalidArgument naming the value). -----------
// An fp8 view needs fp16, bf16 or fp32 activations and finite positive scales; any other view
// takes activations of its own type. CUDA additionally refuses head dims other than 64 and
// 128, activations other than fp16 and bf16, and strides or bases that are not multiples of
// 16 bytes.
Status check_append(const AppendParams& params);
// InvalidArgument unless qo_heads is a positive multiple of a positive kv_heads; `what` names
// the caller.
Status check_heads(std::uint32_t qo_heads, std::uint32_t kv_heads, const char* what);
Status check_decode(const DecodeParams& params);
Status check_prefill(const PrefillParams& params);

// ---- CUDA ----------------------------------------------------------------------------------
// Whether this build has the kernels (built with nvcc). Without them every CUDA call below
// answers Unavailable.
bool attention_kernels_built();

Status append_kv_cuda(const AppendParams& params, void* stream);
Status rope_append_kv_cuda(const RopeAppendParams& params, void* stream);

// How a decode is split over the sequence: `chunks` pieces of `chunk_tokens` per (sequence,
// KV head); when chunks > 1 the last piece of each to finish merges them (same launch).
struct DecodePlan {
  std::uint32_t chunk_tokens = 0;
  std::uint32_t chunks = 0;
  std::size_t workspace_bytes = 0;  // what decode_attention_cuda needs; 0 when chunks == 1
  // Of those, the bytes that count finished pieces. They sit at the END of the workspace as
  // passed (its size rounded down to 4), so every plan that fits in one buffer shares them.
  std::size_t counter_bytes = 0;
};
Result<DecodePlan> plan_decode_cuda(const DecodeParams& params);
// `workspace`: device memory of at least plan_decode_cuda(params).workspace_bytes, 16-byte
// aligned. Its counters must be zero before its first use (zero the whole buffer once after
// allocating it); every call leaves them zero again, so a buffer serves any number of calls
// and graph replays with any plan that fits in it, one at a time (calls sharing a buffer
// must be ordered, e.g. on one stream).
Status decode_attention_cuda(const DecodeParams& params, void* workspace,
                             std::size_t workspace_bytes, void* stream);

Status prefill_attention_cuda(const PrefillParams& params, void* stream);

// ---- CPU float32, multithreaded (threads 0: the hardware's) ---------------------------------
Status append_kv_cpu(const AppendParams& params);
Status decode_attention_cpu(const DecodeParams& params, unsigned threads = 0);
Status prefill_attention_cpu(const PrefillParams& params, unsigned threads = 0);

// ---- CPU float64 reference -------------------------------------------------------------------
// `out` holds rows * qo_heads * head_dim doubles (rows: batch or tokens); params.out is not
// used.
Status decode_attention_reference(const DecodeParams& params, double* out);
Status prefill_attention_reference(const PrefillParams& params, double* out);

// The type of q, k, v and out of a call: `activations`, or the view's element type.
inline DType activations_of(const KvView& view, DType activations) {
  return activations != DType::kUnset ? activations : view.element;
}

// Element conversions of the host paths (round to nearest even; fp8 is e4m3, saturating at
// +-448), for tests and engines.
float element_to_float(DType element, const void* at);
void float_to_element(DType element, float value, void* at);

}  // namespace kvvm
