// The decode kernel's merges: its warps' softmax and outputs merged in the block, the block's
// output (or its chunk's partial) written, and the last block of a sequence merging the chunks'
// partials (the split merged inside the launch; decode.cuh says why).
#pragma once

#include <cstdint>

#include "kernels/attention/decode_shape.cuh"

namespace kvvm::kernels {

// The warp's max and sum of each head for the block's merge of its warps (the quad's four
// lanes each hold a share of the sum).
template <typename Shape>
__device__ __forceinline__ void publish_warp_softmax(float m, float l, const DecodePlace& at,
                                                     float (&s_max)[Shape::kWarps][kDecodeHeads],
                                                     float (&s_sum)[Shape::kWarps][kDecodeHeads]) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (at.quad == 0) {
    s_max[at.warp][at.group_row] = m;
    s_sum[at.warp][at.group_row] = l;
  }
}

// The warp's O^T, weighed against the block's max of each head, as its [head][kOutPitch] floats
// of s_out ([warp][head][kOutPitch]; dims in head order).
template <typename Shape>
__device__ __forceinline__ void stage_warp_output(const float (&o)[Shape::kHeadDim / 16][4],
                                                  const DecodePlace& at,
                                                  const float (&s_max)[Shape::kWarps][kDecodeHeads],
                                                  float* s_out) {
  float factor[2];
#pragma unroll
  for (std::uint32_t h = 0; h < 2; ++h) {
    const std::uint32_t head = 2 * at.quad + h;
    float block_max = kNegInf;
#pragma unroll
    for (std::uint32_t w = 0; w < Shape::kWarps; ++w) block_max = fmaxf(block_max, s_max[w][head]);
    const float own = s_max[at.warp][head];
    factor[h] = own == kNegInf ? 0.0f : exp2f(own - block_max);
  }
  float* mine = s_out + at.warp * kDecodeHeads * Shape::kOutPitch;
#pragma unroll
  for (std::uint32_t mt = 0; mt < Shape::kHeadDim / 16; ++mt) {
    const std::uint32_t dim = output_dim<Shape::kFp8>(mt, at.group_row, 0);
    const std::uint32_t dim8 = output_dim<Shape::kFp8>(mt, at.group_row, 1);
    mine[(2 * at.quad) * Shape::kOutPitch + dim] = o[mt][0] * factor[0];
    mine[(2 * at.quad + 1) * Shape::kOutPitch + dim] = o[mt][1] * factor[1];
    mine[(2 * at.quad) * Shape::kOutPitch + dim8] = o[mt][2] * factor[0];
    mine[(2 * at.quad + 1) * Shape::kOutPitch + dim8] = o[mt][3] * factor[1];
  }
}

// The block's output: the warps' staged outputs summed and normalized, written as the
// sequence's output when its chunk is alone, else as the chunk's partial and log2-sum-exp.
template <typename T, typename Shape>
__device__ __forceinline__ void write_block_output(
    const DecodeKernelParams& p, const DecodePlace& at, std::uint64_t row_base, bool alone,
    float v_scale, const float (&s_max)[Shape::kWarps][kDecodeHeads],
    const float (&s_sum)[Shape::kWarps][kDecodeHeads], const float* s_out) {
  constexpr std::uint32_t D = Shape::kHeadDim;
  for (std::uint32_t index = threadIdx.x; index < kDecodeHeads * D; index += Shape::kThreads) {
    const std::uint32_t head = index / D, dim = index % D;
    float block_max = kNegInf;
#pragma unroll
    for (std::uint32_t w = 0; w < Shape::kWarps; ++w) block_max = fmaxf(block_max, s_max[w][head]);
    float total = 0.0f, sum = 0.0f;
#pragma unroll
    for (std::uint32_t w = 0; w < Shape::kWarps; ++w) {
      total += s_out[(w * kDecodeHeads + head) * Shape::kOutPitch + dim];
      if (s_max[w][head] != kNegInf) sum += s_sum[w][head] * exp2f(s_max[w][head] - block_max);
    }
    if (head >= at.heads_here) continue;
    // The V scale of an e4m3 cache multiplies the output (and so every partial, which the
    // merge only weighs).
    const float value = sum > 0.0f ? (Shape::kFp8 ? total * (v_scale / sum) : total / sum) : 0.0f;
    if (alone) {
      static_cast<T*>(p.out)[(row_base + head) * D + dim] = from_float<T>(value);
    } else {
      p.partial_out[((row_base + head) * p.chunks + at.chunk) * D + dim] = value;
      if (dim == 0) {
        p.partial_lse[(row_base + head) * p.chunks + at.chunk] =
            sum > 0.0f ? block_max + __log2f(sum) : kNegInf;
      }
    }
  }
}

// The counter of this block's (sequence, KV head, tile), counted backwards from the
// workspace's end.
__device__ __forceinline__ std::uint32_t* decode_counter(const DecodeKernelParams& p,
                                                         const DecodePlace& at) {
  return p.counters - 1 -
         ((static_cast<std::uint64_t>(at.b) * p.kv_heads + at.kv_head) * p.group_tiles + at.tile);
}

// Counts the block done on its group's counter (its partials made visible before): true in the
// last of its live_chunks blocks to finish, which then sees every other block's partials.
__device__ __forceinline__ bool finished_last(std::uint32_t* counter, std::uint32_t live_chunks,
                                              bool& s_last) {
  if (threadIdx.x == 0) s_last = atomicAdd(counter, 1u) == live_chunks - 1;
  __syncthreads();
  if (!s_last) return false;
  __threadfence();  // and the others' partials are seen by this one
  return true;
}

// Each thread merges up to kMergeVectors float4s of the output with an online softmax over
// the chunks, kMergeBatch at a time: every log2-sum-exp and partial of a batch is loaded
// before any is used, so up to kMergeBatch chunks cost one round trip to L2 (the merge is
// on the launch's critical path).
template <typename T, typename Shape>
__device__ __forceinline__ void merge_chunk_partials(const DecodeKernelParams& p,
                                                     std::uint64_t row_base,
                                                     std::uint32_t heads_here,
                                                     std::uint32_t live_chunks) {
  constexpr std::uint32_t D = Shape::kHeadDim;
  constexpr std::uint32_t kMergeBatch = 16;
  constexpr std::uint32_t kPerHead = D / 4;
#pragma unroll
  for (std::uint32_t i = 0; i < Shape::kMergeVectors; ++i) {
    const std::uint32_t index = threadIdx.x + i * Shape::kThreads;
    if (index >= heads_here * kPerHead) break;
    const std::uint32_t head = index / kPerHead, part = index % kPerHead;
    const float* lse = p.partial_lse + (row_base + head) * p.chunks;
    const float4* partial =
        reinterpret_cast<const float4*>(p.partial_out + (row_base + head) * p.chunks * D) + part;
    float most = kNegInf, sum = 0.0f;
    float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (std::uint32_t c0 = 0; c0 < live_chunks; c0 += kMergeBatch) {
      float x[kMergeBatch];
      float4 y[kMergeBatch];
#pragma unroll
      for (std::uint32_t u = 0; u < kMergeBatch; ++u) {
        const bool here = c0 + u < live_chunks;
        x[u] = here ? __ldcg(lse + c0 + u) : kNegInf;
        y[u] = here ? __ldcg(partial + static_cast<std::uint64_t>(c0 + u) * kPerHead)
                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      float batch_max = kNegInf;
#pragma unroll
      for (std::uint32_t u = 0; u < kMergeBatch; ++u) batch_max = fmaxf(batch_max, x[u]);
      const float new_max = fmaxf(most, batch_max);
      if (new_max == kNegInf) continue;           // no chunk so far saw a token
      const float scale = exp2f(most - new_max);  // 0 when most is -inf
      sum *= scale;
      total.x *= scale;
      total.y *= scale;
      total.z *= scale;
      total.w *= scale;
#pragma unroll
      for (std::uint32_t u = 0; u < kMergeBatch; ++u) {
        const float w = x[u] == kNegInf ? 0.0f : exp2f(x[u] - new_max);
        sum += w;
        total.x = fmaf(w, y[u].x, total.x);
        total.y = fmaf(w, y[u].y, total.y);
        total.z = fmaf(w, y[u].z, total.z);
        total.w = fmaf(w, y[u].w, total.w);
      }
      most = new_max;
    }
    const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* out = static_cast<T*>(p.out) + (row_base + head) * D + part * 4;
    out[0] = from_float<T>(total.x * inverse);
    out[1] = from_float<T>(total.y * inverse);
    out[2] = from_float<T>(total.z * inverse);
    out[3] = from_float<T>(total.w * inverse);
  }
}

}  // namespace kvvm::kernels
