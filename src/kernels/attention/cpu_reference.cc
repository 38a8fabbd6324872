// The float64 reference of decode and prefill attention: the plain definition, two passes
// (scores, then softmax-weighted values), every product and sum in double, reading the cache
// element by element through the KvView. Tests compare every other path against it; nothing
// here is meant to be fast.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/attention/kv_access.h"
#include "kernels/element.h"
#include "kvvm/kernels/attention.h"

namespace kvvm {
namespace {

using kernels::kv_access_of;
using kernels::KvAccess;

struct Head {
  const KvView& view;
  const KvAccess& access;
  std::uint32_t layer;
  std::uint32_t slot;
  std::uint32_t kv_head;

  // Row `token` of K (kv 0) or V (kv 1), dequantized, as doubles.
  void row(std::uint32_t kv, std::uint64_t token, std::vector<double>& out) const {
    const auto* at = reinterpret_cast<const unsigned char*>(
        static_cast<std::uintptr_t>(view.address(slot, layer, kv, kv_head, token)));
    const double scale = kv == 0 ? access.k_of(kv_head) : access.v_of(kv_head);  // exact
    for (std::uint32_t d = 0; d < view.head_dim; ++d) {
      out[d] =
          scale * kernels::load_element(view.element, at + std::uint64_t{d} * view.element_bytes);
    }
  }
};

// out[d] = sum_t softmax_t(scale * q . k_t) v_t[d] over tokens [0, length); zeros for none.
void attend(const Head& head, const unsigned char* q, std::uint64_t length, double scale,
            double* out) {
  const KvView& view = head.view;
  const std::uint32_t dim = view.head_dim;
  const DType activations = head.access.activations;
  const std::uint32_t bytes = element_bytes(activations);
  std::vector<double> query(dim);
  for (std::uint32_t d = 0; d < dim; ++d) {
    query[d] = kernels::load_element(activations, q + std::uint64_t{d} * bytes);
  }
  std::fill(out, out + dim, 0.0);
  if (length == 0) return;
  std::vector<double> scores(length), row(dim);
  double max_score = -std::numeric_limits<double>::infinity();
  for (std::uint64_t t = 0; t < length; ++t) {
    head.row(0, t, row);
    double dot = 0;
    for (std::uint32_t d = 0; d < dim; ++d) dot += query[d] * row[d];
    scores[t] = dot * scale;
    max_score = std::max(max_score, scores[t]);
  }
  double sum = 0;
  for (std::uint64_t t = 0; t < length; ++t) {
    scores[t] = std::exp(scores[t] - max_score);
    sum += scores[t];
  }
  for (std::uint64_t t = 0; t < length; ++t) {
    const double weight = scores[t] / sum;
    head.row(1, t, row);
    for (std::uint32_t d = 0; d < dim; ++d) out[d] += weight * row[d];
  }
}

double scale_of_double(float sm_scale, std::uint32_t head_dim) {
  return sm_scale != 0 ? static_cast<double>(sm_scale) : 1.0 / std::sqrt(double(head_dim));
}

}  // namespace

Status decode_attention_reference(const DecodeParams& params, double* out) {
  DecodeParams p = params;
  p.out = out;  // the reference writes doubles to `out`, not to params.out
  KVVM_RETURN_IF_ERROR(check_decode(p));
  KVVM_RETURN_IF_ERROR(
      kernels::check_host_head_scales(p.view, p.head_scales, p.kv_heads, "decode reference"));
  const std::uint32_t dim = p.view.head_dim;
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  const auto* q = static_cast<const unsigned char*>(p.q);
  const KvAccess access = kv_access_of(p);
  const std::uint32_t bytes = element_bytes(access.activations);
  for (std::uint32_t b = 0; b < p.batch; ++b) {
    if (p.lengths[b] > p.max_length) {
      return Status::InvalidArgument("decode reference: sequence " + std::to_string(b) + " has " +
                                     std::to_string(p.lengths[b]) + " tokens, above max_length " +
                                     std::to_string(p.max_length));
    }
    for (std::uint32_t h = 0; h < p.qo_heads; ++h) {
      const std::uint64_t row = std::uint64_t{b} * p.qo_heads + h;
      attend(Head{p.view, access, p.layer, p.slots[b], h / group}, q + row * dim * bytes,
             p.lengths[b], scale_of_double(p.sm_scale, dim), out + row * dim);
    }
  }
  return Status::Ok();
}

Status prefill_attention_reference(const PrefillParams& params, double* out) {
  PrefillParams p = params;
  p.out = out;
  KVVM_RETURN_IF_ERROR(check_prefill(p));
  KVVM_RETURN_IF_ERROR(
      kernels::check_host_head_scales(p.view, p.head_scales, p.kv_heads, "prefill reference"));
  const std::uint32_t dim = p.view.head_dim;
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  const auto* q = static_cast<const unsigned char*>(p.q);
  const KvAccess access = kv_access_of(p);
  const std::uint32_t bytes = element_bytes(access.activations);
  for (std::uint32_t i = 0; i < p.tokens; ++i) {
    for (std::uint32_t h = 0; h < p.qo_heads; ++h) {
      const std::uint64_t row = std::uint64_t{i} * p.qo_heads + h;
      attend(Head{p.view, access, p.layer, p.slot, h / group}, q + row * dim * bytes,
             std::uint64_t{p.start} + i + 1, scale_of_double(p.sm_scale, dim), out + row * dim);
    }
  }
  return Status::Ok();
}

}  // namespace kvvm
