// Host launchers of the model kernels: check the parameters (InvalidArgument naming the value,
// before any CUDA call, so they run without a GPU too), dispatch the element type, launch, and
// report the launch's error as a Status.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "base/format.h"
#include "kernels/common.cuh"
#include "kernels/model/model_kernels.cuh"
#include "kvvm/kernels/model_kernels.h"

namespace kvvm {
namespace {

using kernels::cuda_status;
using kernels::launch_overlapping;

Status check_element(DType element, const char* what) {
  if (element != DType::kFp16 && element != DType::kBf16) {
    return Status::InvalidArgument(std::string(what) + ": element type " +
                                   std::string(to_string(element)) +
                                   " is not supported by the CUDA model kernels (fp16, bf16)");
  }
  return Status::Ok();
}

Status check_pointers(std::initializer_list<std::pair<const void*, const char*>> pointers,
                      const char* what) {
  for (const auto& [pointer, name] : pointers) {
    if (pointer == nullptr) {
      return Status::InvalidArgument(std::string(what) + ": " + name + " is null");
    }
  }
  return Status::Ok();
}

Status check_positive(std::uint64_t value, const char* name, const char* what) {
  if (value == 0) return Status::InvalidArgument(std::string(what) + ": " + name + " is 0");
  return Status::Ok();
}

Status last_launch(const char* kernel) { return cuda_status(kernel, cudaGetLastError()); }

// Blocks of a grid-stride loop over `total` elements.
unsigned flat_blocks(std::uint64_t total) {
  const std::uint64_t blocks = (total + kernels::kFlatThreads - 1) / kernels::kFlatThreads;
  return static_cast<unsigned>(std::min<std::uint64_t>(blocks, kernels::kMaxFlatBlocks));
}

// Element type to the CUDA type T; the caller checked the element first.
#define KVVM_MODEL_DISPATCH(element, T, ...) \
  if ((element) == ::kvvm::DType::kFp16) {   \
    using T = __half;                        \
    __VA_ARGS__                              \
  } else {                                   \
    using T = __nv_bfloat16;                 \
    __VA_ARGS__                              \
  }

bool aligned_16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// Rows of whole 16-byte vectors, each row 16-byte aligned, that a block's registers hold.
bool rmsnorm_fits_vectors(const RmsNormParams& p) {
  constexpr std::uint32_t kPer = 8;  // 16 bytes of fp16 / bf16
  return p.hidden % kPer == 0 && p.hidden <= kernels::kRowThreads * kPer * kernels::kNormVectors &&
         aligned_16(p.x) && aligned_16(p.weight) && aligned_16(p.out) &&
         (p.add == nullptr || aligned_16(p.add));
}

// A QuantizedRows request's own checks (fp8_quantize_cuda checks the rest of what it takes).
Status check_quantized(const QuantizedRows& q, std::uint32_t rows, std::uint32_t width,
                       const char* kernel) {
  if (q.scales == nullptr) {
    return Status::InvalidArgument(std::string(kernel) + ": quantized.scales is null");
  }
  if (q.stride < rows) {
    return Status::InvalidArgument(std::string(kernel) + ": quantized.stride " + str(q.stride) +
                                   " is below rows " + str(rows));
  }
  const std::uint32_t multiple = q.kind == Fp8Scales::kBlock128 ? kFp8Block : 16;
  if (width % multiple != 0) {
    return Status::InvalidArgument(std::string(kernel) + ": a quantized width of " + str(width) +
                                   " is not a multiple of " + str(multiple));
  }
  return Status::Ok();
}

// Whether the kernel itself writes the quantized copy (16-byte vectors of the row, 8 bytes of
// e4m3 each); otherwise fp8_quantize_cuda reads the rows the kernel wrote.
bool quantized_in_kernel(const QuantizedRows& q, std::uint32_t width) {
  return width % 8 == 0 && aligned_16(q.out);
}

Status quantize_separately(const QuantizedRows& q, DType element, std::uint32_t rows,
                           std::uint32_t width, const void* x, cudaStream_t stream) {
  Fp8QuantizeArgs args;
  args.element = element;
  args.scales_kind = q.kind;
  args.rows = rows;
  args.in = width;
  args.stride = q.stride;
  args.x = x;
  args.out = q.out;
  args.scales = q.scales;
  return fp8_quantize_cuda(args, stream);
}

}  // namespace

bool model_kernels_built() { return true; }

Status embedding_cuda(const EmbeddingParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_element(p.element, "embedding"));
  if (p.tokens == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_positive(p.hidden, "hidden", "embedding"));
  KVVM_RETURN_IF_ERROR(check_positive(p.vocab, "vocab", "embedding"));
  KVVM_RETURN_IF_ERROR(
      check_pointers({{p.ids, "ids"}, {p.table, "table"}, {p.out, "out"}}, "embedding"));
  auto* s = static_cast<cudaStream_t>(stream);
  KVVM_MODEL_DISPATCH(
      p.element, T, { kernels::embedding_kernel<T><<<p.tokens, kernels::kRowThreads, 0, s>>>(p); })
  return last_launch("embedding_kernel<<<>>>");
}

Status rmsnorm_cuda(const RmsNormParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_element(p.element, "rmsnorm"));
  if (p.rows == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_positive(p.hidden, "hidden", "rmsnorm"));
  KVVM_RETURN_IF_ERROR(
      check_pointers({{p.x, "x"}, {p.weight, "weight"}, {p.out, "out"}}, "rmsnorm"));
  if (!(p.eps >= 0.0f)) {
    return Status::InvalidArgument("rmsnorm: eps " + std::to_string(p.eps) + " is negative");
  }
  const QuantizedRows& q = p.quantized;
  if (q.out != nullptr) {
    KVVM_RETURN_IF_ERROR(check_quantized(q, p.rows, p.hidden, "rmsnorm"));
    if (p.row_index != nullptr) {
      return Status::InvalidArgument("rmsnorm: a quantized copy of gathered rows (row_index)");
    }
  }
  auto* s = static_cast<cudaStream_t>(stream);
  if (rmsnorm_fits_vectors(p) && (q.out == nullptr || quantized_in_kernel(q, p.hidden))) {
    const std::uint32_t blocks = q.out != nullptr ? q.stride : p.rows;
    KVVM_MODEL_DISPATCH(p.element, T, {
      return cuda_status("cudaLaunchKernelEx(rmsnorm_vector_kernel)",
                         launch_overlapping(kernels::rmsnorm_vector_kernel<T>, dim3(blocks),
                                            kernels::kRowThreads, 0, s, p));
    })
  }
  KVVM_MODEL_DISPATCH(p.element, T, {
    KVVM_RETURN_IF_ERROR(cuda_status("cudaLaunchKernelEx(rmsnorm_kernel)",
                                     launch_overlapping(kernels::rmsnorm_kernel<T>, dim3(p.rows),
                                                        kernels::kRowThreads, 0, s, p)));
  })
  return q.out == nullptr ? Status::Ok()
                          : quantize_separately(q, p.element, p.rows, p.hidden, p.out, s);
}

Status rope_cuda(const RopeParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_element(p.element, "rope"));
  if (p.tokens == 0) return Status::Ok();
  if (p.head_dim == 0 || p.head_dim % 2 != 0) {
    return Status::InvalidArgument("rope: head dim " + str(p.head_dim) +
                                   " is not a positive even number");
  }
  KVVM_RETURN_IF_ERROR(check_positive(p.q_heads, "q_heads", "rope"));
  if (p.k != nullptr) KVVM_RETURN_IF_ERROR(check_positive(p.k_heads, "k_heads", "rope"));
  KVVM_RETURN_IF_ERROR(
      check_pointers({{p.q, "q"}, {p.positions, "positions"}, {p.inv_freq, "inv_freq"}}, "rope"));
  auto* s = static_cast<cudaStream_t>(stream);
  KVVM_MODEL_DISPATCH(p.element, T,
                      { kernels::rope_kernel<T><<<p.tokens, kernels::kRowThreads, 0, s>>>(p); })
  return last_launch("rope_kernel<<<>>>");
}

Status silu_mul_cuda(const SiluMulParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_element(p.element, "silu_mul"));
  if (p.rows == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_positive(p.inter, "inter", "silu_mul"));
  KVVM_RETURN_IF_ERROR(check_pointers({{p.gate_up, "gate_up"}, {p.out, "out"}}, "silu_mul"));
  const QuantizedRows& q = p.quantized;
  if (q.out != nullptr) KVVM_RETURN_IF_ERROR(check_quantized(q, p.rows, p.inter, "silu_mul"));
  auto* s = static_cast<cudaStream_t>(stream);
  const bool in_kernel = q.out != nullptr && quantized_in_kernel(q, p.inter) &&
                         aligned_16(p.gate_up) && aligned_16(p.out);
  if (in_kernel && q.kind == Fp8Scales::kBlock128) {
    const dim3 grid(q.stride,
                    (p.inter / 8 + kernels::kSiluGroupThreads - 1) / kernels::kSiluGroupThreads);
    KVVM_MODEL_DISPATCH(p.element, T, {
      return cuda_status("cudaLaunchKernelEx(silu_mul_groups_kernel)",
                         launch_overlapping(kernels::silu_mul_groups_kernel<T>, grid,
                                            kernels::kSiluGroupThreads, 0, s, p));
    })
  }
  if (in_kernel && p.inter <= kernels::kSiluRowThreads * kernels::kSiluRowVectors * 8) {
    KVVM_MODEL_DISPATCH(p.element, T, {
      return cuda_status("cudaLaunchKernelEx(silu_mul_row_kernel)",
                         launch_overlapping(kernels::silu_mul_row_kernel<T>, dim3(q.stride),
                                            kernels::kSiluRowThreads, 0, s, p));
    })
  }
  const unsigned blocks = flat_blocks(std::uint64_t{p.rows} * p.inter);
  KVVM_MODEL_DISPATCH(p.element, T, {
    KVVM_RETURN_IF_ERROR(cuda_status("cudaLaunchKernelEx(silu_mul_kernel)",
                                     launch_overlapping(kernels::silu_mul_kernel<T>, dim3(blocks),
                                                        kernels::kFlatThreads, 0, s, p)));
  })
  return q.out == nullptr ? Status::Ok()
                          : quantize_separately(q, p.element, p.rows, p.inter, p.out, s);
}

Status absmax_cuda(const AbsMaxParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_element(p.element, "absmax"));
  if (p.count == 0) return Status::Ok();
  if (p.x == nullptr || p.out == nullptr) {
    return Status::InvalidArgument("absmax: " + std::to_string(p.count) +
                                   " elements but no x or out");
  }
  auto* s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = flat_blocks(p.count);
  KVVM_MODEL_DISPATCH(p.element, T,
                      { kernels::absmax_kernel<T><<<blocks, kernels::kFlatThreads, 0, s>>>(p); })
  return last_launch("absmax_kernel<<<>>>");
}

Status broadcast_rows_cuda(const BroadcastRowsParams& p, void* stream) {
  KVVM_RETURN_IF_ERROR(check_element(p.element, "broadcast_rows"));
  if (p.rows == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_positive(p.cols, "cols", "broadcast_rows"));
  KVVM_RETURN_IF_ERROR(check_pointers({{p.row, "row"}, {p.out, "out"}}, "broadcast_rows"));
  auto* s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = flat_blocks(std::uint64_t{p.rows} * p.cols);
  KVVM_MODEL_DISPATCH(p.element, T, {
    kernels::broadcast_rows_kernel<T><<<blocks, kernels::kFlatThreads, 0, s>>>(p);
  })
  return last_launch("broadcast_rows_kernel<<<>>>");
}

Status dummy_fill_cuda(const DummyFillParams& p, void* stream) {
  // fp32 (an FP8 projection's scales) and fp8 (its weights) besides the compute types.
  if (p.element != DType::kFp32 && p.element != DType::kFp8) {
    KVVM_RETURN_IF_ERROR(check_element(p.element, "dummy_fill"));
  }
  if (p.count == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_pointers({{p.out, "out"}}, "dummy_fill"));
  auto* s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = flat_blocks(p.count);
  if (p.element == DType::kFp32) {
    kernels::dummy_fill_kernel<float><<<blocks, kernels::kFlatThreads, 0, s>>>(p);
  } else if (p.element == DType::kFp8) {
    kernels::dummy_fill_kernel<std::uint8_t><<<blocks, kernels::kFlatThreads, 0, s>>>(p);
  } else {
    KVVM_MODEL_DISPATCH(p.element, T, {
      kernels::dummy_fill_kernel<T><<<blocks, kernels::kFlatThreads, 0, s>>>(p);
    })
  }
  return last_launch("dummy_fill_kernel<<<>>>");
}

Status argmax_cuda(const ArgmaxParams& p, void* stream) {
  if (p.rows == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_positive(p.vocab, "vocab", "argmax"));
  KVVM_RETURN_IF_ERROR(check_pointers({{p.logits, "logits"}, {p.out, "out"}}, "argmax"));
  auto* s = static_cast<cudaStream_t>(stream);
  // A stretch of at least 2,048 entries: below that a block's start-up outweighs its reads.
  constexpr std::uint32_t kLeastStretch = 2048;
  const std::uint32_t splits =
      std::min<std::uint32_t>(kArgmaxSplits, (p.vocab + kLeastStretch - 1) / kLeastStretch);
  if (p.workspace == nullptr || splits == 1) {
    return cuda_status(
        "cudaLaunchKernelEx(argmax_kernel)",
        launch_overlapping(kernels::argmax_kernel, dim3(p.rows), kernels::kRowThreads, 0, s, p));
  }
  const std::uint32_t stretch = (p.vocab + splits - 1) / splits;
  KVVM_RETURN_IF_ERROR(
      cuda_status("cudaLaunchKernelEx(argmax_split_kernel)",
                  launch_overlapping(kernels::argmax_split_kernel, dim3(splits, p.rows),
                                     kernels::kRowThreads, 0, s, p, stretch)));
  return cuda_status(
      "cudaLaunchKernelEx(argmax_merge_kernel)",
      launch_overlapping(kernels::argmax_merge_kernel, dim3(p.rows), 32, 0, s, p, splits));
}

}  // namespace kvvm
