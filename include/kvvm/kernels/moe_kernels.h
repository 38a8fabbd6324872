// The CUDA kernels of a mixture-of-experts layer (Qwen3-MoE, Mixtral, Qwen2-MoE as Hugging Face
// runs them), in the order a step calls them:
//   1. the router's logits: a plain GEMM of the normed hidden rows by the router's
//      [experts][hidden] weight (the model's own projection path; not here);
//   2. moe_route_cuda: softmax over all experts in float32, the top k, renormalised when the
//      config says so, each token's expert ids and weights left on the device;
//   3. moe_permute_cuda: the (token, choice) pairs sorted by expert with a counting sort, each
//      expert's run of rows padded to the GEMM's tile, so one grouped GEMM serves every expert;
//   4. moe_expert_gate_up_cuda: per expert, gate|up of its rows (gathered from the hidden rows),
//      SiLU(gate) * up fused into the epilogue;
//   5. moe_expert_down_cuda: per expert, down of those rows with the pair's routing weight applied,
//      each written to its (token, choice) slot; then the combine sums a token's k slots in choice
//      order (fixed, so a token's output is the same bits whatever else is in the batch).
// Everything past the router reads its counts from device memory: no host synchronisation, the
// whole layer capturable in a CUDA graph with shapes fixed by `tokens` alone.
//
// Experts are addressed through per-expert pointer tables in device memory (`gate_up[e]`,
// `down[e]`, their scales), so an expert may sit anywhere: at its place in a resident layer block,
// or in whichever stable-address slot a residency cache gives it, the table rewritten on the
// device without re-capturing a graph.
//
// Rounding (the parity oracle is transformers in bf16 / fp16, whose ops compute in float32 and
// round to the tensor's type after each op): gate and up are rounded to the element type, then
// silu(gate) rounded, then the product rounded (as SiluMulParams); the down projection's float32
// sum is rounded to the element type, multiplied by the routing weight rounded to the element type
// (transformers casts the weights to the activations' type), the product rounded; the combine
// sums a token's k products in float32 in choice order and rounds once. Conventions as
// model_kernels.h: device pointers, launches asynchronous on `stream` and capturable, zero tokens
// launch nothing, a build without nvcc answers Unavailable.
#pragma once

#include <cstdint>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"
#include "kvvm/kernels/fp8_kernels.h"

namespace kvvm {

// Whether this build has the MoE kernels (built with nvcc).
bool moe_kernels_built();

inline constexpr std::uint32_t kMoeMaxExperts = 512;
inline constexpr std::uint32_t kMoeMaxTopK = 16;

// For each token t: p = softmax(float(logits[t])) over `experts` in float32; the top_k largest
// p, in descending order, the lower expert id first among equal values (torch.topk's order on
// ties); with `renormalize`, each chosen p divided by the sum of the chosen (Mixtral always,
// Qwen3-MoE / Qwen2-MoE when norm_topk_prob). ids[t][j] and weights[t][j] (float32, not yet
// rounded to the element type). A NaN logit sorts below every number: it takes no part in the
// softmax's maximum or sum (the other experts' p are the softmax over the numbers), its own p is
// NaN, and it is chosen only when fewer than top_k logits are numbers.
struct MoeRouteParams {
  DType element = DType::kUnset;  // of logits: fp16, bf16 or fp32
  std::uint32_t tokens = 0;
  std::uint32_t experts = 0;  // at most kMoeMaxExperts
  std::uint32_t top_k = 0;    // 1 .. min(experts, kMoeMaxTopK)
  bool renormalize = false;
  const void* logits = nullptr;  // [tokens][experts]
  std::int32_t* ids = nullptr;   // [tokens][top_k]
  float* weights = nullptr;      // [tokens][top_k]
};
// moe_route_cuda's checks, in every build (no CUDA call): InvalidArgument naming the value.
Status check_moe_route(const MoeRouteParams& params);
Status moe_route_cuda(const MoeRouteParams& params, void* stream);

// The permuted order: pairs p = t * top_k + j grouped by expert ids[p], experts in id order and
// within an expert by p ascending (a stable counting sort), each expert's run starting at a
// multiple of `tile`. Written, all in device memory:
//   offsets[e] .. offsets[e + 1]: expert e's rows (offsets[experts] the padded total; the rows
//     past an expert's pairs and before the next run are padding);
//   rows[r]: the pair at permuted row r (r < offsets[experts]), kMoePadRow for padding;
//   slot_of_pair[p]: the permuted row pair p went to;
//   active[0]: how many experts have a pair; active[1 ..]: their ids, ascending (the grouped
//     GEMMs launch blocks for min(experts, tokens * top_k) experts and look up which here, so a
//     batch of one token reads only its chosen experts).
// `capacity` is moe_permuted_rows(tokens, top_k, experts, tile): the rows buffer's length.
inline constexpr std::uint32_t kMoePadRow = ~std::uint32_t{0};
std::uint64_t moe_permuted_rows(std::uint32_t tokens, std::uint32_t top_k, std::uint32_t experts,
                                std::uint32_t tile);
struct MoePermuteParams {
  std::uint32_t tokens = 0;
  std::uint32_t top_k = 0;
  std::uint32_t experts = 0;
  std::uint32_t tile = 0;             // a power of two: the grouped GEMMs' row tile (kMoeRowTile)
  const std::int32_t* ids = nullptr;  // [tokens][top_k], each in [0, experts)
  std::uint32_t* offsets = nullptr;   // [experts + 1]
  std::uint32_t* rows = nullptr;      // [capacity]
  std::uint32_t* slot_of_pair = nullptr;  // [tokens * top_k]
  std::uint32_t* active = nullptr;        // [1 + experts]
  void* scratch = nullptr;                // moe_permute_scratch_bytes(experts) bytes
};
inline constexpr std::uint32_t kMoeRowTile = 16;
std::uint64_t moe_permute_scratch_bytes(std::uint32_t experts);
Status check_moe_permute(const MoePermuteParams& params);
Status moe_permute_cuda(const MoePermuteParams& params, void* stream);

// Expert weights in a block format: kNone is the element type itself; kFp8Block128 is e4m3 with
// one float32 scale per 128 x 128 block (Hugging Face "fp8", as Qwen3-30B-A3B-FP8), scales
// [ceil(rows / 128)][scale_row] row-major with scale_row = ceil(in / 128) rounded up to a multiple
// of 4 (the layout the dense FP8 path keeps). A new format is a kernel path and a loader entry.
enum class MoeWeightFormat : std::uint8_t { kNone, kFp8Block128 };

// act[r] = round(round(silu(round(gate))) * round(up)) for each permuted row r of expert e, with
// gate|up = x[rows[r] / top_k] . gate_up[e]^T, gate_up[e] = [2 * inter][hidden] (gate rows then
// up rows, as the dense MLP keeps them). Padding rows are written as zeros.
struct MoeGateUpParams {
  DType element = DType::kUnset;  // of x and act: fp16 or bf16
  MoeWeightFormat format = MoeWeightFormat::kNone;
  std::uint32_t tokens = 0;
  std::uint32_t top_k = 0;
  std::uint32_t experts = 0;
  std::uint32_t hidden = 0;                      // a multiple of 16 (of 128 for kFp8Block128)
  std::uint32_t inter = 0;                       // a multiple of 16 (of 128 for kFp8Block128)
  const void* x = nullptr;                       // [tokens][hidden]
  const void* const* gate_up = nullptr;          // [experts] device pointers, 16-byte aligned
  const float* const* gate_up_scales = nullptr;  // [experts], kFp8Block128 only
  const std::uint32_t* offsets = nullptr;        // moe_permute_cuda's
  const std::uint32_t* rows = nullptr;
  const std::uint32_t* active = nullptr;
  void* act = nullptr;  // [capacity][inter]
  // For measuring and tests: the grouped GEMM's row tile, 16, 64 or 128 rows (0: chosen from
  // tokens * top_k over the experts it can reach). Any choice computes the same bits.
  std::uint32_t block_rows = 0;
};
Status check_moe_gate_up(const MoeGateUpParams& params);
Status moe_expert_gate_up_cuda(const MoeGateUpParams& params, void* stream);

// out[t] = round(sum over j < top_k, in order, of float(y[t][j])) with
// y[t][j] = round(round(act[slot_of_pair[p]] . down[e]^T) * round(weights[p])), p = t * top_k + j,
// e = ids[p], down[e] = [hidden][inter]. `pairs` is scratch for the y rows. With a shared expert
// (Qwen2-MoE: `shared` non-null), out[t] = round(round(sum) + round(round(sigmoid(g)) *
// shared[t])) with g = shared_gate[t] (its gate's logit, in the element type): transformers'
// sigmoid(shared_expert_gate(x)) * shared_expert(x) added to the routed experts' sum.
struct MoeDownParams {
  DType element = DType::kUnset;
  MoeWeightFormat format = MoeWeightFormat::kNone;
  std::uint32_t tokens = 0;
  std::uint32_t top_k = 0;
  std::uint32_t experts = 0;
  std::uint32_t hidden = 0;
  std::uint32_t inter = 0;
  const void* act = nullptr;                  // moe_expert_gate_up_cuda's
  const void* const* down = nullptr;          // [experts] device pointers
  const float* const* down_scales = nullptr;  // [experts], kFp8Block128 only
  const std::uint32_t* offsets = nullptr;
  const std::uint32_t* rows = nullptr;
  const std::uint32_t* active = nullptr;
  const std::uint32_t* slot_of_pair = nullptr;
  const float* weights = nullptr;     // moe_route_cuda's [tokens][top_k]
  void* pairs = nullptr;              // [tokens * top_k][hidden] in the element type
  const void* shared = nullptr;       // [tokens][hidden] or null
  const void* shared_gate = nullptr;  // [tokens] (a [tokens][1] GEMM's output); with `shared`
  void* out = nullptr;                // [tokens][hidden]
  std::uint32_t block_rows = 0;       // as MoeGateUpParams::block_rows
};
Status check_moe_down(const MoeDownParams& params);
Status moe_expert_down_cuda(const MoeDownParams& params, void* stream);

// The residency of a mixture's experts cached in stable-address slots, decided on the device:
// the policy of the host's ExpertCache (src/model/weights/expert_cache.h) run by the GPU between
// the router and the permutation, so a sparse layer neither reads its routed ids back nor waits
// on the host, and a step with cached experts stays inside a CUDA graph.
//
// moe_residency_cuda launches two kernels. The plan (one block): counts the rows routed to each
// expert of sparse layer `layer`; every `decay_every`-th acquisition first halves every expert's
// count; adds each wanted expert's rows to its count and stamps its last use; then, for each
// wanted expert not resident, in ascending id, evicts the slot whose holder is not wanted by this
// layer with the lowest (count, last use, slot) and gives it to the expert; rewrites the layer's
// pointer tables for its wanted experts; leaves the misses in `copy_list` and adds to the
// counters. The copy (a grid): reads each missed expert's bytes from pinned host staging over the
// bus (a device-side read of mapped host memory: no copy engine call, so nothing for the host to
// issue) into its slot. The next kernel on the stream (the permutation) starts after the copy
// has ended, so the grouped GEMMs read the new bytes.
//
// An entry of an expert evicted since is stale, but no kernel reads an entry its step did not
// route to, and every routed one is rewritten by its layer's plan first.
inline constexpr std::uint32_t kMoeNoSlot = ~std::uint32_t{0};
inline constexpr std::uint64_t kMoeNoOffset = ~std::uint64_t{0};
struct MoeResidencyCounters {
  std::uint64_t acquisitions = 0;  // plans run, over every sparse layer
  std::uint64_t lookups = 0;       // wanted experts
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t bytes_copied = 0;
  std::uint64_t copy_ns = 0;  // from a plan with misses to its copy's end (%globaltimer)
  // The last plan's, for its copy: when it ended, and its misses; blocks of the copy done.
  std::uint64_t planned_at = 0;
  std::uint32_t copies = 0;
  std::uint32_t finished_blocks = 0;
};
struct MoeResidencyParams {
  std::uint32_t tokens = 0;
  std::uint32_t top_k = 0;
  std::uint32_t experts = 0;        // per sparse layer; at most slots
  std::uint32_t sparse_layers = 0;  // layer < sparse_layers
  std::uint32_t layer = 0;
  std::uint32_t slots = 0;            // every slot holds an expert (the caller preloads them)
  std::uint64_t expert_bytes = 0;     // a positive multiple of 16
  std::uint64_t decay_every = 0;      // acquisitions between two halvings of the counts
  const std::int32_t* ids = nullptr;  // moe_route_cuda's [tokens][top_k]; others are skipped
  // State, in device memory, indexed by sparse layer * experts + expert (slot_of, count,
  // last_use) or by slot (holder): its slot or kMoeNoSlot, its routed rows (halving), the
  // acquisition that last wanted it; the expert index each slot holds.
  std::uint32_t* slot_of = nullptr;
  std::uint64_t* count = nullptr;
  std::uint64_t* last_use = nullptr;
  std::uint32_t* holder = nullptr;
  std::uint32_t* copy_list = nullptr;  // [2 * experts]: (slot, expert index) of each miss
  MoeResidencyCounters* counters = nullptr;
  // Pinned host memory mapped for the device (null: none): the counters are written there too
  // after each plan and copy, for the host to read without a synchronisation.
  MoeResidencyCounters* mirror = nullptr;
  void* first_slot = nullptr;       // slot s at first_slot + s * expert_bytes (16-byte aligned)
  const void* staging = nullptr;    // mapped host: expert i at staging + i * expert_bytes
  std::uint64_t* tables = nullptr;  // this layer's [4][experts] (gate|up, down, their scales)
  // Offsets of an expert's tensors inside its expert_bytes; kMoeNoOffset: no such tensor (the
  // scales of unquantized experts).
  std::uint64_t gate_up_offset = 0;
  std::uint64_t down_offset = 0;
  std::uint64_t gate_up_scale_offset = kMoeNoOffset;
  std::uint64_t down_scale_offset = kMoeNoOffset;
};
Status check_moe_residency(const MoeResidencyParams& params);
Status moe_residency_cuda(const MoeResidencyParams& params, void* stream);

}  // namespace kvvm
