// A step's logit transforms on the device (include/kvvm/kernels/model_kernels.h,
// logit_adjust_cuda): penalties, logit_bias and bans applied to each row's listed tokens in place,
// after the LM head and before argmax, sampling and log-probabilities read the row.
//
// Why one thread per entry and no atomics: a row's ids are distinct, so no two threads touch one
// logit. Why one block per row: a captured decode step launches this kernel at every replay, and
// a row without transforms (the common case) costs one read of its parameters; a row listing a
// whole vocabulary takes a few hundred strided iterations per thread, still far below the
// sampling kernel's passes over the same row.
//
// Why the arithmetic is written with __f*_rn intrinsics: it mirrors
// kvvm::model::adjusted_logit (src/model/sampling.cc, the CPU reference, which this file cannot
// include) operation for operation, and the intrinsics keep nvcc from fusing the multiply and
// add into an FMA, which would round once where the CPU rounds twice.
#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kvvm/kernels/model_kernels.h"

namespace kvvm {
namespace kernels {
namespace {

constexpr unsigned kAdjustThreads = 256;

// kvvm::model::adjusted_logit, step for step: l += bias; the repetition penalty on a seen
// token; then l -= frequency * count + presence * (count > 0).
__device__ __forceinline__ float adjusted_logit(float logit, const LogitAdjustRow& row,
                                                const LogitAdjustEntry& a) {
  float l = __fadd_rn(logit, a.bias);
  if (row.repetition_penalty != 1.0f && (a.count > 0 || a.in_prompt != 0)) {
    l = l > 0.0f ? __fdiv_rn(l, row.repetition_penalty) : __fmul_rn(l, row.repetition_penalty);
  }
  const float seen = __fadd_rn(__fmul_rn(row.frequency_penalty, __uint2float_rn(a.count)),
                               a.count > 0 ? row.presence_penalty : 0.0f);
  return __fsub_rn(l, seen);
}

__global__ void __launch_bounds__(kAdjustThreads) logit_adjust_kernel(const LogitAdjustParams p) {
  const LogitAdjustRow row = p.rows_params[blockIdx.x];
  if (row.count == 0) return;
  float* logits = p.logits + std::uint64_t{blockIdx.x} * p.vocab;
  for (std::uint32_t i = threadIdx.x; i < row.count; i += blockDim.x) {
    const LogitAdjustEntry a = p.entries[std::uint64_t{row.begin} + i];
    if (a.id < 0 || static_cast<std::uint32_t>(a.id) >= p.vocab) continue;
    logits[a.id] = adjusted_logit(logits[a.id], row, a);
  }
}

}  // namespace
}  // namespace kernels

Status logit_adjust_cuda(const LogitAdjustParams& p, void* stream) {
  if (p.rows == 0) return Status::Ok();
  if (p.vocab == 0) return Status::InvalidArgument("logit_adjust: vocab is 0");
  if (p.logits == nullptr || p.rows_params == nullptr || p.entries == nullptr) {
    return Status::InvalidArgument(std::string("logit_adjust: ") +
                                   (p.logits == nullptr        ? "logits"
                                    : p.rows_params == nullptr ? "rows_params"
                                                               : "entries") +
                                   " is null");
  }
  kernels::logit_adjust_kernel<<<p.rows, kernels::kAdjustThreads, 0,
                                 static_cast<cudaStream_t>(stream)>>>(p);
  return kernels::cuda_status("logit_adjust_kernel<<<>>>", cudaGetLastError());
}

}  // namespace kvvm
