// Token masks on the device (include/kvvm/kernels/model_kernels.h, token_mask_cuda): structured
// output's allowed tokens applied to each masked row's logits in place, after the logit
// transforms and before argmax, sampling and log-probabilities read the row.
//
// Why a thread per mask word: a word covers 32 logits, so a 152K vocabulary is 4,750 threads a
// row; a word of all ones (most words inside a string) costs one read and no write, and a row
// without a mask exits after reading its index.
#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kvvm/kernels/model_kernels.h"

namespace kvvm {
namespace kernels {
namespace {

constexpr unsigned kMaskThreads = 256;

__global__ void __launch_bounds__(kMaskThreads) token_mask_kernel(const TokenMaskParams p) {
  const std::int32_t mask_row = p.mask_rows[blockIdx.y];
  if (mask_row < 0) return;
  const std::uint32_t w = blockIdx.x * blockDim.x + threadIdx.x;
  if (w >= p.words) return;
  const std::uint32_t bits = p.masks[std::uint64_t(mask_row) * p.words + w];
  if (bits == 0xFFFFFFFFu) return;
  float* logits = p.logits + std::uint64_t{blockIdx.y} * p.vocab;
  const std::uint32_t first = w * 32;
  const std::uint32_t count = min(32u, p.vocab - first);
  for (std::uint32_t b = 0; b < count; ++b) {
    if (((bits >> b) & 1u) == 0) logits[first + b] = -INFINITY;
  }
}

}  // namespace
}  // namespace kernels

Status token_mask_cuda(const TokenMaskParams& p, void* stream) {
  if (p.rows == 0) return Status::Ok();
  if (p.vocab == 0 || p.words != (p.vocab + 31) / 32) {
    return Status::InvalidArgument("token_mask: " + std::to_string(p.words) +
                                   " words a row for a vocabulary of " + std::to_string(p.vocab));
  }
  if (p.logits == nullptr || p.mask_rows == nullptr || p.masks == nullptr) {
    return Status::InvalidArgument(std::string("token_mask: ") +
                                   (p.logits == nullptr      ? "logits"
                                    : p.mask_rows == nullptr ? "mask_rows"
                                                             : "masks") +
                                   " is null");
  }
  const dim3 grid((p.words + kernels::kMaskThreads - 1) / kernels::kMaskThreads, p.rows);
  kernels::token_mask_kernel<<<grid, kernels::kMaskThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p);
  return kernels::cuda_status("token_mask_kernel<<<>>>", cudaGetLastError());
}

}  // namespace kvvm
