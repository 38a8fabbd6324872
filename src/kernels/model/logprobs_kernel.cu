// Device log-probabilities (include/kvvm/kernels/model_kernels.h, logprobs_cuda): the CPU's
// row_logprobs (src/model/sampling.cc) for one row per block, in one read of the row.
//
// Why this shape: a decode step asks for a handful of alternatives out of ~150k logits, so the
// cost must be one streaming read, not a sort. Each warp walks its share of the row in
// ascending id order, 128 ids at a time, and keeps its best `top` (value, id) pairs sorted in
// the registers of lanes 0..top-1; a logit enters only when it beats the warp's current last
// (a ballot finds them, one insertion each), which after the first few hundred ids is rare.
// Beside that each lane keeps an online log-sum-exp (running maximum and the sum rescaled to
// it). The warps' lists are then merged pairwise (each element's rank in the merged list is
// its own index plus the count of the other list's elements before it), and the warps' sums
// folded into the row's.
//
// Order: descending logit, the lower id first among equals, the CPU's; the temperature
// divides after the order is fixed, so it cannot reorder ties.
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kvvm/kernels/model_kernels.h"

namespace kvvm {
namespace kernels {
namespace {

constexpr unsigned kLogprobThreads = 1024;
constexpr unsigned kLogprobWarps = kLogprobThreads / 32;
constexpr unsigned kLoadsPerLane = 4;  // a warp takes 128 consecutive ids a pass
constexpr unsigned kWarpSpan = 32 * kLoadsPerLane;
constexpr std::uint32_t kNoId = 0xffffffffu;  // an empty list entry
constexpr unsigned kFullMask = 0xffffffffu;

// Whether (va, ia) ranks before (vb, ib): a larger logit, or an equal one of a lower id. An
// empty entry ranks after everything.
__device__ __forceinline__ bool precedes(float va, std::uint32_t ia, float vb, std::uint32_t ib) {
  return ia != kNoId && (ib == kNoId || va > vb || (va == vb && ia < ib));
}

// A sum of exp((l - from) * scale) re-expressed against the maximum `to` >= from. An empty
// sum (from = -inf) stays 0 and equal maxima (+inf included) leave it alone: no NaN.
__device__ __forceinline__ float rescale(float sum, float from, float to, float scale) {
  if (from == to) return sum;
  if (from == kNegInf) return 0.0f;
  return sum * expf((from - to) * scale);
}

struct LogprobShared {
  float list_value[kLogprobWarps][kMaxLogprobTop];
  std::uint32_t list_id[kLogprobWarps][kMaxLogprobTop];
  float warp_max[kLogprobWarps];
  float warp_sum[kLogprobWarps];
  float row_max;
  float log_sum;
};

__global__ void __launch_bounds__(kLogprobThreads) logprobs_kernel(const LogprobsParams p) {
  __shared__ LogprobShared sh;
  const LogprobRow params = p.rows_params[blockIdx.x];
  if (params.active == 0) return;  // uniform across the block
  const float* row = p.logits + static_cast<std::uint64_t>(blockIdx.x) * p.vocab;
  const float scale = params.temperature > 0 ? 1.0f / params.temperature : 1.0f;
  const unsigned k = min(params.top, kMaxLogprobTop);
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Lanes [0, k) hold the warp's list, best first.
  float list_value = kNegInf;
  std::uint32_t list_id = kNoId;
  float last_value = kNegInf;  // the list's k-th entry, every lane
  std::uint32_t last_id = kNoId;
  float max = kNegInf, sum = 0.0f;
  for (std::uint32_t base = warp * kWarpSpan; base < p.vocab; base += kLogprobWarps * kWarpSpan) {
    float values[kLoadsPerLane];
#pragma unroll
    for (unsigned j = 0; j < kLoadsPerLane; ++j) {
      const std::uint32_t i = base + j * 32 + lane;
      values[j] = i < p.vocab ? row[i] : NAN;
    }
#pragma unroll
    for (unsigned j = 0; j < kLoadsPerLane; ++j) {
      const float v = values[j];
      if (isnan(v) || v == kNegInf) continue;  // no mass
      if (v > max) {
        sum = rescale(sum, max, v, scale) + 1.0f;
        max = v;
      } else {
        sum += expf((v - max) * scale);
      }
    }
    if (k == 0) continue;
#pragma unroll
    for (unsigned j = 0; j < kLoadsPerLane; ++j) {
      const float v = values[j];
      const std::uint32_t id = base + j * 32 + lane;
      const bool listed = !isnan(v) && id < p.vocab;
      unsigned pending = __ballot_sync(kFullMask, listed && precedes(v, id, last_value, last_id));
      while (pending != 0) {
        const int leader = __ffs(static_cast<int>(pending)) - 1;
        const float cv = __shfl_sync(kFullMask, v, leader);
        const std::uint32_t ci = __shfl_sync(kFullMask, id, leader);
        // The list is sorted: the entries before the candidate are a prefix.
        const unsigned at = static_cast<unsigned>(
            __popc(__ballot_sync(kFullMask, lane < k && precedes(list_value, list_id, cv, ci))));
        const float up_value = __shfl_up_sync(kFullMask, list_value, 1);
        const std::uint32_t up_id = __shfl_up_sync(kFullMask, list_id, 1);
        if (lane == at) {
          list_value = cv;
          list_id = ci;
        } else if (lane > at && lane < k) {
          list_value = up_value;
          list_id = up_id;
        }
        last_value = __shfl_sync(kFullMask, list_value, k - 1);
        last_id = __shfl_sync(kFullMask, list_id, k - 1);
        pending &= ~(1u << leader);
        pending &= __ballot_sync(kFullMask, listed && precedes(v, id, last_value, last_id));
      }
    }
  }

  // The warp's log-sum-exp state, then the row's (thread 0, after the barrier below).
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_max = __shfl_xor_sync(kFullMask, max, offset);
    const float other_sum = __shfl_xor_sync(kFullMask, sum, offset);
    const float joint = fmaxf(max, other_max);
    sum = rescale(sum, max, joint, scale) + rescale(other_sum, other_max, joint, scale);
    max = joint;
  }
  if (lane == 0) {
    sh.warp_max[warp] = max;
    sh.warp_sum[warp] = sum;
  }
  if (lane < k) {
    sh.list_value[warp][lane] = list_value;
    sh.list_id[warp][lane] = list_id;
  }
  // Pairwise merges: after the round of `stride`, warp w (a multiple of 2 * stride) holds the
  // best k of warps [w, w + 2 * stride).
  for (unsigned stride = 1; stride < kLogprobWarps; stride *= 2) {
    __syncthreads();
    if (k == 0 || warp % (2 * stride) != 0) continue;
    const unsigned a = warp, b = warp + stride;
    float av = kNegInf, bv = kNegInf;
    std::uint32_t ai = kNoId, bi = kNoId;
    if (lane < k) {
      av = sh.list_value[a][lane];
      ai = sh.list_id[a][lane];
      bv = sh.list_value[b][lane];
      bi = sh.list_id[b][lane];
    }
    unsigned a_rank = lane, b_rank = lane;
    for (unsigned j = 0; j < k; ++j) {
      a_rank += precedes(sh.list_value[b][j], sh.list_id[b][j], av, ai) ? 1u : 0u;
      b_rank += precedes(sh.list_value[a][j], sh.list_id[a][j], bv, bi) ? 1u : 0u;
    }
    __syncwarp();
    // Ranks are distinct, and the entries past the merged count were empty in list a.
    if (ai != kNoId && a_rank < k) {
      sh.list_value[a][a_rank] = av;
      sh.list_id[a][a_rank] = ai;
    }
    if (bi != kNoId && b_rank < k) {
      sh.list_value[a][b_rank] = bv;
      sh.list_id[a][b_rank] = bi;
    }
  }
  if (threadIdx.x == 0) {
    float row_max = kNegInf;
    for (unsigned w = 0; w < kLogprobWarps; ++w) row_max = fmaxf(row_max, sh.warp_max[w]);
    float row_sum = 0.0f;
    for (unsigned w = 0; w < kLogprobWarps; ++w) {
      row_sum += rescale(sh.warp_sum[w], sh.warp_max[w], row_max, scale);
    }
    sh.row_max = row_max;
    // No finite maximum (all NaN or -inf, or +inf present): the softmax is undefined.
    sh.log_sum = isfinite(row_max) ? logf(row_sum) : NAN;
  }
  __syncthreads();
  if (warp != 0) return;
  const float row_max = sh.row_max, log_sum = sh.log_sum;
  LogprobResult& out = p.out[blockIdx.x];
  const std::uint32_t id = lane < k ? sh.list_id[0][lane] : kNoId;
  if (id != kNoId) {
    out.top_ids[lane] = static_cast<std::int32_t>(id);
    out.top_logprobs[lane] = (sh.list_value[0][lane] - row_max) * scale - log_sum;
  }
  const unsigned listed = __popc(__ballot_sync(kFullMask, id != kNoId));
  if (lane == 0) {
    std::int32_t target = params.target;
    if (target == kLogprobSampled) target = p.sampled != nullptr ? p.sampled[blockIdx.x] : -1;
    const bool inside = target >= 0 && static_cast<std::uint32_t>(target) < p.vocab;
    out.target = target;
    out.logprob = inside ? (row[target] - row_max) * scale - log_sum : NAN;
    out.top = listed;
  }
}

}  // namespace
}  // namespace kernels

Status logprobs_cuda(const LogprobsParams& p, void* stream) {
  if (p.rows == 0) return Status::Ok();
  if (p.vocab == 0) return Status::InvalidArgument("logprobs: vocab is 0");
  if (p.logits == nullptr || p.rows_params == nullptr || p.out == nullptr) {
    return Status::InvalidArgument(std::string("logprobs: ") +
                                   (p.logits == nullptr        ? "logits"
                                    : p.rows_params == nullptr ? "rows_params"
                                                               : "out") +
                                   " is null");
  }
  kernels::
      logprobs_kernel<<<p.rows, kernels::kLogprobThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          p);
  return kernels::cuda_status("logprobs_kernel<<<>>>", cudaGetLastError());
}

}  // namespace kvvm
