// Parameter checks shared by the CUDA, CPU and reference paths, and the host element
// conversions. Why one place: every path must refuse the same malformed call with the same
// words, so a test of the CPU path's refusals also pins what the CUDA launchers refuse before
// their own (head dim, element type, alignment) checks.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/element.h"
#include "kvvm/kernels/attention.h"

namespace kvvm {
namespace {

Status check_view(const KvView& view, const char* what) {
  const std::string prefix = std::string(what) + ": ";
  if (view.base == 0) return Status::InvalidArgument(prefix + "the KvView has no base address");
  if (view.head_dim == 0) return Status::InvalidArgument(prefix + "the KvView has head_dim 0");
  const std::uint32_t bytes = element_bytes(view.element);
  if (bytes == 0) {
    return Status::InvalidArgument(prefix + "element type " +
                                   std::to_string(static_cast<std::uint32_t>(view.element)) +
                                   " is not readable here (fp16, bf16, fp8 or fp32)");
  }
  if (view.element_bytes != bytes) {
    return Status::InvalidArgument(
        prefix + "the KvView says " + std::to_string(view.element_bytes) +
        " bytes per element but its element type has " + std::to_string(bytes));
  }
  return Status::Ok();
}

// An fp8 view takes 16- or 32-bit activations and finite positive scales; any other view
// takes activations of its own element type (its scales are not read).
Status check_activations(const KvView& view, DType activations, float k_scale, float v_scale,
                         const KvHeadScales& head_scales, const char* what) {
  const std::string prefix = std::string(what) + ": ";
  if (view.element != DType::kFp8) {
    if (activations != DType::kUnset && activations != view.element) {
      return Status::InvalidArgument(prefix + "activations in " +
                                     std::string(to_string(activations)) + " over a " +
                                     std::string(to_string(view.element)) +
                                     " cache; only an fp8 cache takes activations of another type");
    }
    return Status::Ok();
  }
  if (activations != DType::kFp16 && activations != DType::kBf16 && activations != DType::kFp32) {
    return Status::InvalidArgument(prefix +
                                   "an fp8 cache needs fp16, bf16 or fp32 activations, "
                                   "got " +
                                   std::string(to_string(activations)));
  }
  for (const auto& [name, scale] : {std::pair{"k_scale", k_scale}, std::pair{"v_scale", v_scale}}) {
    if (!std::isfinite(scale) || scale <= 0.0f) {
      return Status::InvalidArgument(prefix + name + " " + std::to_string(scale) +
                                     " is not a finite positive scale");
    }
  }
  if ((head_scales.k == nullptr) != (head_scales.v == nullptr)) {
    return Status::InvalidArgument(prefix + "per-head scales for " +
                                   (head_scales.k != nullptr ? "K" : "V") +
                                   " only; give both or neither");
  }
  return Status::Ok();
}

}  // namespace

Status check_heads(std::uint32_t qo_heads, std::uint32_t kv_heads, const char* what) {
  if (kv_heads == 0 || qo_heads == 0 || qo_heads % kv_heads != 0) {
    return Status::InvalidArgument(std::string(what) + ": " + std::to_string(qo_heads) +
                                   " query heads are not a positive multiple of " +
                                   std::to_string(kv_heads) + " KV heads");
  }
  return Status::Ok();
}

Status check_append(const AppendParams& p) {
  KVVM_RETURN_IF_ERROR(check_view(p.view, "append"));
  KVVM_RETURN_IF_ERROR(
      check_activations(p.view, p.activations, p.k_scale, p.v_scale, p.head_scales, "append"));
  if (p.kv_heads == 0) return Status::InvalidArgument("append: 0 KV heads");
  if ((p.row_slots == nullptr) != (p.row_positions == nullptr)) {
    return Status::InvalidArgument(
        "append: give both row_slots and row_positions (a decode step) or neither (a chunk)");
  }
  if (p.tokens > 0 && (p.k == nullptr || p.v == nullptr)) {
    return Status::InvalidArgument("append: " + std::to_string(p.tokens) + " rows but no k or v");
  }
  return Status::Ok();
}

Status check_decode(const DecodeParams& p) {
  KVVM_RETURN_IF_ERROR(check_view(p.view, "decode"));
  KVVM_RETURN_IF_ERROR(
      check_activations(p.view, p.activations, p.k_scale, p.v_scale, p.head_scales, "decode"));
  KVVM_RETURN_IF_ERROR(check_heads(p.qo_heads, p.kv_heads, "decode"));
  if (p.batch > 0 &&
      (p.q == nullptr || p.slots == nullptr || p.lengths == nullptr || p.out == nullptr)) {
    return Status::InvalidArgument("decode: batch of " + std::to_string(p.batch) +
                                   " but q, slots, lengths or out is null");
  }
  if (p.max_length == 0) {
    return Status::InvalidArgument("decode: max_length must bound the lengths, got 0");
  }
  return Status::Ok();
}

Status check_prefill(const PrefillParams& p) {
  KVVM_RETURN_IF_ERROR(check_view(p.view, "prefill"));
  KVVM_RETURN_IF_ERROR(
      check_activations(p.view, p.activations, p.k_scale, p.v_scale, p.head_scales, "prefill"));
  KVVM_RETURN_IF_ERROR(check_heads(p.qo_heads, p.kv_heads, "prefill"));
  if (p.tokens > 0 && (p.q == nullptr || p.out == nullptr)) {
    return Status::InvalidArgument("prefill: " + std::to_string(p.tokens) +
                                   " query rows but q or out is null");
  }
  if (std::uint64_t{p.start} + p.tokens > UINT32_MAX) {
    return Status::InvalidArgument("prefill: positions up to " +
                                   std::to_string(std::uint64_t{p.start} + p.tokens) +
                                   " exceed 32 bits");
  }
  return Status::Ok();
}

float element_to_float(DType element, const void* at) {
  return kernels::load_element(element, static_cast<const unsigned char*>(at));
}

void float_to_element(DType element, float value, void* at) {
  kernels::store_element(element, value, static_cast<unsigned char*>(at));
}

}  // namespace kvvm
