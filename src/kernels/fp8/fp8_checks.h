// The host-side checks of the FP8 kernels' arguments (include/kvvm/kernels/fp8_kernels.h), in plain
// C++ (header-only: the CUDA library and the CPU build's stand-ins both run them, and the CPU suite
// tests them): each names the bad value.
#pragma once

#include <cstdint>
#include <string>

#include "base/format.h"
#include "kvvm/base/status.h"
#include "kvvm/kernels/fp8_kernels.h"

namespace kvvm::kernels {

namespace fp8_detail {

inline bool misaligned(const void* pointer) {
  return reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0;
}

inline Status check_type(DType element, const char* who) {
  if (element == DType::kFp16 || element == DType::kBf16) return Status::Ok();
  return Status::InvalidArgument(std::string(who) + ": element type " +
                                 std::string(to_string(element)) + " is not fp16 or bf16");
}

inline Status check_pointer(const void* pointer, const char* name, const char* who, bool aligned) {
  if (pointer == nullptr)
    return Status::InvalidArgument(std::string(who) + ": " + name + " is null");
  if (aligned && misaligned(pointer)) {
    return Status::InvalidArgument(std::string(who) + ": " + name + " is not 16-byte aligned");
  }
  return Status::Ok();
}

}  // namespace fp8_detail

inline Status check_fp8_gemv(const Fp8GemvArgs& p) {
  KVVM_RETURN_IF_ERROR(fp8_detail::check_type(p.element, "fp8_gemv"));
  const bool quantized = p.xq != nullptr;
  const std::uint32_t max_rows = quantized ? kFp8MmaGemvRows : kFp8GemvMaxRows;
  if (p.rows > max_rows) {
    return Status::InvalidArgument("fp8_gemv: " + str(p.rows) + " rows, more than " +
                                   str(max_rows) + (quantized ? " with xq" : "") +
                                   " (a GEMM's shape)");
  }
  if (p.split != 0 && p.split != 1 && p.split != 2 && p.split != 4 && p.split != 8) {
    return Status::InvalidArgument("fp8_gemv: split " + str(p.split) + " is not 0, 1, 2, 4 or 8");
  }
  if (p.unroll != 0 && p.unroll != 4 && !(p.unroll == 8 && (p.rows <= 2 || quantized))) {
    return Status::InvalidArgument("fp8_gemv: unroll " + str(p.unroll) + " with " + str(p.rows) +
                                   " rows (0, 4, or 8 for at most 2 rows or with xq)");
  }
  const std::uint32_t multiple =
      quantized && p.scales_kind == Fp8Scales::kBlock128 ? kFp8Block : 16;
  if (p.in == 0 || p.in % multiple != 0 || p.out == 0) {
    return Status::InvalidArgument("fp8_gemv: in " + str(p.in) + " x out " + str(p.out) +
                                   ": both positive, in a multiple of " + str(multiple));
  }
  if (quantized && p.x != nullptr) {
    return Status::InvalidArgument("fp8_gemv: both x and xq given (one form of the activations)");
  }
  if (quantized && p.x_stride < p.rows) {
    return Status::InvalidArgument("fp8_gemv: x_stride " + str(p.x_stride) + " is below rows " +
                                   str(p.rows));
  }
  if (p.rows == 0) return Status::Ok();
  if (quantized) {
    KVVM_RETURN_IF_ERROR(fp8_detail::check_pointer(p.xq, "xq", "fp8_gemv", true));
    KVVM_RETURN_IF_ERROR(fp8_detail::check_pointer(p.x_scales, "x_scales", "fp8_gemv", false));
  } else {
    KVVM_RETURN_IF_ERROR(fp8_detail::check_pointer(p.x, "x", "fp8_gemv", true));
  }
  KVVM_RETURN_IF_ERROR(fp8_detail::check_pointer(p.weight, "weight", "fp8_gemv", true));
  KVVM_RETURN_IF_ERROR(fp8_detail::check_pointer(p.scales, "scales", "fp8_gemv", false));
  return fp8_detail::check_pointer(p.y, "y", "fp8_gemv", false);
}

inline Status check_fp8_quantize(const Fp8QuantizeArgs& p) {
  KVVM_RETURN_IF_ERROR(fp8_detail::check_type(p.element, "fp8_quantize"));
  const std::uint32_t multiple = p.scales_kind == Fp8Scales::kBlock128 ? kFp8Block : 16;
  if (p.in == 0 || p.in % multiple != 0) {
    return Status::InvalidArgument("fp8_quantize: in " + str(p.in) +
                                   " is not a positive multiple of " + str(multiple));
  }
  if (p.stride < p.rows) {
    return Status::InvalidArgument("fp8_quantize: stride " + str(p.stride) + " is below rows " +
                                   str(p.rows));
  }
  if (p.stride == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(fp8_detail::check_pointer(p.x, "x", "fp8_quantize", true));
  KVVM_RETURN_IF_ERROR(fp8_detail::check_pointer(p.out, "out", "fp8_quantize", true));
  return fp8_detail::check_pointer(p.scales, "scales", "fp8_quantize", false);
}

}  // namespace kvvm::kernels
