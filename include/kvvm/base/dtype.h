// DType: the element type of the KV cache, one enum for the geometry (how many bytes a token
// costs), the KvView (what a kernel reads) and the kernels (which types they accept).
#pragma once

#include <cstdint>
#include <string_view>

#include "kvvm/base/status.h"

#if !defined(KVVM_HOST_DEVICE)
#if defined(__CUDACC__)
#define KVVM_HOST_DEVICE __host__ __device__
#else
#define KVVM_HOST_DEVICE
#endif
#endif

namespace kvvm {

// kUnset (0) is what a zero-initialised KvView holds: it has no size, plan_layout and every
// kernel launcher refuse it.
enum class DType : std::uint32_t { kUnset = 0, kFp16 = 1, kBf16 = 2, kFp8 = 3, kFp32 = 4 };

// Bytes of one element; 0 for kUnset or a value that is not a DType.
KVVM_HOST_DEVICE constexpr std::uint32_t element_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
    case DType::kBf16:
      return 2;
    case DType::kFp8:
      return 1;
    case DType::kFp32:
      return 4;
    case DType::kUnset:
      break;
  }
  return 0;
}

// "fp16", "bf16", "fp8", "fp32"; "unset" for kUnset.
std::string_view to_string(DType dtype);

// "fp16", "float16", "half", "bf16", "bfloat16", "fp8", "float8", "fp32", "float32", "float"
// (also with a "torch." prefix). InvalidArgument naming the known names otherwise.
Result<DType> parse_dtype(std::string_view text);

}  // namespace kvvm
