// The per-head RMSNorm's parameter checks (include/kvvm/kernels/model_kernels.h,
// check_head_rmsnorm), inline: the CUDA launcher (head_norm_kernel.cu) and the library's
// check_head_rmsnorm (head_norm_checks.cc) both call them, so a machine without nvcc refuses the
// same calls with the same words, and the CUDA library needs no symbol of the host one.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "kvvm/kernels/model_kernels.h"

namespace kvvm::kernels {

inline Status head_rmsnorm_checks(const HeadRmsNormParams& p) {
  const std::string what = "head_rmsnorm: ";
  if (p.element != DType::kFp16 && p.element != DType::kBf16) {
    return Status::InvalidArgument(what + "element type " + std::string(to_string(p.element)) +
                                   " is not supported by the CUDA model kernels (fp16, bf16)");
  }
  if (p.tokens == 0) return Status::Ok();  // nothing is read or written
  if (p.head_dim == 0 || p.head_dim % 2 != 0 || p.head_dim > kMaxHeadNormDim) {
    return Status::InvalidArgument(what + "head dim " + std::to_string(p.head_dim) +
                                   " is not an even number from 2 to " +
                                   std::to_string(kMaxHeadNormDim));
  }
  const std::uint64_t heads = std::uint64_t{p.q_heads} + p.kv_heads;
  if (heads == 0) {
    return Status::InvalidArgument(what + "no heads to normalise (q_heads 0, kv_heads 0)");
  }
  if (p.token_stride < heads * p.head_dim) {
    return Status::InvalidArgument(what + "token_stride " + std::to_string(p.token_stride) +
                                   " is below the " + std::to_string(heads * p.head_dim) +
                                   " elements of a token's " + std::to_string(heads) +
                                   " heads of " + std::to_string(p.head_dim));
  }
  // One warp a row, eight rows a block: the grid's x dimension bounds the rows.
  constexpr std::uint64_t kMostRows = std::uint64_t{0x7fffffff} * 8;
  if (std::uint64_t{p.tokens} * heads > kMostRows) {
    return Status::InvalidArgument(what + std::to_string(p.tokens) + " tokens of " +
                                   std::to_string(heads) + " heads are more rows than one launch " +
                                   "covers (" + std::to_string(kMostRows) + ")");
  }
  if (p.x == nullptr) return Status::InvalidArgument(what + "x is null");
  if (p.q_heads > 0 && p.q_weight == nullptr) {
    return Status::InvalidArgument(what + "q_weight is null for " + std::to_string(p.q_heads) +
                                   " q heads");
  }
  if (p.kv_heads > 0 && p.k_weight == nullptr) {
    return Status::InvalidArgument(what + "k_weight is null for " + std::to_string(p.kv_heads) +
                                   " kv heads");
  }
  if (!(p.eps >= 0.0f) || std::isinf(p.eps)) {
    return Status::InvalidArgument(what + "eps " + std::to_string(p.eps) +
                                   " is not a finite number >= 0");
  }
  return Status::Ok();
}

}  // namespace kvvm::kernels
