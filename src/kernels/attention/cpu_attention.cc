// The host backend's attention: float32, multithreaded, reading the cache through the
// KvView like the kernels do (a CPU engine runs it on host-driver arenas).
//
// Why one work item per (row, KV head): the group's query heads share that KV head, so each
// K and V row is converted once and used by every query head of the group (as the CUDA
// decode kernel does); items are handed out through an atomic counter so threads that draw
// short sequences take more of them.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "kernels/attention/kv_access.h"
#include "kernels/element.h"
#include "kvvm/kernels/attention.h"

namespace kvvm {
namespace {

const unsigned char* host_pointer(std::uint64_t address) {
  return reinterpret_cast<const unsigned char*>(static_cast<std::uintptr_t>(address));
}

float scale_of(float sm_scale, std::uint32_t head_dim) {
  return sm_scale != 0 ? sm_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

void load_row(DType element, const unsigned char* at, std::uint32_t n, float* out) {
  const std::uint32_t bytes = element_bytes(element);
  for (std::uint32_t i = 0; i < n; ++i) out[i] = kernels::load_element(element, at + i * bytes);
}

using kernels::kv_access_of;
using kernels::KvAccess;

// Online softmax over tokens [0, length) of one KV head for `group` query heads.
// q, out: [group][dim] in the activations' type.
void attend_group(const KvView& view, const KvAccess& access, std::uint32_t layer,
                  std::uint32_t slot, std::uint32_t kv_head, const unsigned char* q,
                  std::uint32_t group, std::uint64_t length, float scale, unsigned char* out) {
  const std::uint32_t dim = view.head_dim;
  const std::uint32_t bytes = element_bytes(access.activations);
  std::vector<float> query(std::size_t{group} * dim), acc(std::size_t{group} * dim, 0.0f);
  std::vector<float> row(dim), max_score(group, -std::numeric_limits<float>::infinity()),
      sum(group, 0.0f), weight(group);
  for (std::uint32_t j = 0; j < group; ++j) {
    load_row(access.activations, q + std::size_t{j} * dim * bytes, dim,
             &query[std::size_t{j} * dim]);
  }
  // The K scale multiplies the score, the V scale the output: each stored element is read
  // exactly, and a bf16 / fp16 / fp32 cache multiplies by 1.
  scale *= access.k_of(kv_head);
  for (std::uint64_t t = 0; t < length; ++t) {
    load_row(view.element, host_pointer(view.address(slot, layer, 0, kv_head, t)), dim, row.data());
    for (std::uint32_t j = 0; j < group; ++j) {
      const float* qj = &query[std::size_t{j} * dim];
      float dot = 0;
      for (std::uint32_t d = 0; d < dim; ++d) dot += qj[d] * row[d];
      const float score = dot * scale;
      const float new_max = std::max(max_score[j], score);
      const float correction = std::exp(max_score[j] - new_max);  // exp(-inf) = 0 at first
      weight[j] = std::exp(score - new_max);
      sum[j] = sum[j] * correction + weight[j];
      max_score[j] = new_max;
      float* aj = &acc[std::size_t{j} * dim];
      for (std::uint32_t d = 0; d < dim; ++d) aj[d] *= correction;
    }
    load_row(view.element, host_pointer(view.address(slot, layer, 1, kv_head, t)), dim, row.data());
    for (std::uint32_t j = 0; j < group; ++j) {
      float* aj = &acc[std::size_t{j} * dim];
      for (std::uint32_t d = 0; d < dim; ++d) aj[d] += weight[j] * row[d];
    }
  }
  for (std::uint32_t j = 0; j < group; ++j) {
    const float inverse = sum[j] > 0 ? access.v_of(kv_head) / sum[j] : 0.0f;  // no token: zeros
    for (std::uint32_t d = 0; d < dim; ++d) {
      kernels::store_element(access.activations, acc[std::size_t{j} * dim + d] * inverse,
                             out + (std::size_t{j} * dim + d) * bytes);
    }
  }
}

// Runs body(item) for item in [0, items) on up to `threads` threads.
template <typename Body>
void parallel_for(std::uint64_t items, unsigned threads, const Body& body) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::uint64_t>(threads, items));
  std::atomic<std::uint64_t> next{0};
  auto work = [&] {
    for (std::uint64_t item = next++; item < items; item = next++) body(item);
  };
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
}

}  // namespace

Status append_kv_cpu(const AppendParams& p) {
  KVVM_RETURN_IF_ERROR(check_append(p));
  KVVM_RETURN_IF_ERROR(
      kernels::check_host_head_scales(p.view, p.head_scales, p.kv_heads, "append"));
  const KvAccess access = kv_access_of(p);
  const std::uint32_t dim = p.view.head_dim;
  const DType activations = activations_of(p.view, p.activations);
  const std::uint64_t row_bytes = std::uint64_t{dim} * p.view.element_bytes;
  const std::uint64_t from_bytes = std::uint64_t{dim} * element_bytes(activations);
  const auto* k = static_cast<const unsigned char*>(p.k);
  const auto* v = static_cast<const unsigned char*>(p.v);
  // One row into the cache: a copy, or for fp8 each element divided by its scale and
  // rounded (the same float division and rounding as the CUDA append).
  const auto store = [&](const unsigned char* from, std::uint64_t address, float scale) {
    auto* to = reinterpret_cast<unsigned char*>(address);
    if (p.view.element != DType::kFp8) {
      std::memcpy(to, from, row_bytes);
      return;
    }
    const std::uint32_t bytes = element_bytes(activations);
    for (std::uint32_t d = 0; d < dim; ++d) {
      to[d] = kernels::float_to_e4m3(kernels::load_element(activations, from + d * bytes) / scale);
    }
  };
  for (std::uint32_t i = 0; i < p.tokens; ++i) {
    const std::uint32_t slot = p.row_slots != nullptr ? p.row_slots[i] : p.slot;
    const std::uint64_t position =
        p.row_positions != nullptr ? p.row_positions[i] : std::uint64_t{p.start} + i;
    for (std::uint32_t h = 0; h < p.kv_heads; ++h) {
      const std::uint64_t from = (std::uint64_t{i} * p.kv_heads + h) * from_bytes;
      store(k + from, p.view.address(slot, p.layer, 0, h, position), access.k_of(h));
      store(v + from, p.view.address(slot, p.layer, 1, h, position), access.v_of(h));
    }
  }
  return Status::Ok();
}

Status decode_attention_cpu(const DecodeParams& p, unsigned threads) {
  KVVM_RETURN_IF_ERROR(check_decode(p));
  KVVM_RETURN_IF_ERROR(
      kernels::check_host_head_scales(p.view, p.head_scales, p.kv_heads, "decode"));
  for (std::uint32_t b = 0; b < p.batch; ++b) {
    if (p.lengths[b] > p.max_length) {
      return Status::InvalidArgument("decode: sequence " + std::to_string(b) + " has " +
                                     std::to_string(p.lengths[b]) + " tokens, above max_length " +
                                     std::to_string(p.max_length));
    }
  }
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  const KvAccess access = kv_access_of(p);
  const std::uint64_t head_bytes =
      std::uint64_t{p.view.head_dim} * element_bytes(access.activations);
  const auto* q = static_cast<const unsigned char*>(p.q);
  auto* out = static_cast<unsigned char*>(p.out);
  const float scale = scale_of(p.sm_scale, p.view.head_dim);
  parallel_for(std::uint64_t{p.batch} * p.kv_heads, threads, [&](std::uint64_t item) {
    const auto b = static_cast<std::uint32_t>(item / p.kv_heads);
    const auto h = static_cast<std::uint32_t>(item % p.kv_heads);
    const std::uint64_t first = (std::uint64_t{b} * p.qo_heads + std::uint64_t{h} * group);
    attend_group(p.view, access, p.layer, p.slots[b], h, q + first * head_bytes, group,
                 p.lengths[b], scale, out + first * head_bytes);
  });
  return Status::Ok();
}

Status prefill_attention_cpu(const PrefillParams& p, unsigned threads) {
  KVVM_RETURN_IF_ERROR(check_prefill(p));
  KVVM_RETURN_IF_ERROR(
      kernels::check_host_head_scales(p.view, p.head_scales, p.kv_heads, "prefill"));
  const std::uint32_t group = p.qo_heads / p.kv_heads;
  const KvAccess access = kv_access_of(p);
  const std::uint64_t head_bytes =
      std::uint64_t{p.view.head_dim} * element_bytes(access.activations);
  const auto* q = static_cast<const unsigned char*>(p.q);
  auto* out = static_cast<unsigned char*>(p.out);
  const float scale = scale_of(p.sm_scale, p.view.head_dim);
  parallel_for(std::uint64_t{p.tokens} * p.kv_heads, threads, [&](std::uint64_t item) {
    const auto i = static_cast<std::uint32_t>(item / p.kv_heads);
    const auto h = static_cast<std::uint32_t>(item % p.kv_heads);
    const std::uint64_t first = (std::uint64_t{i} * p.qo_heads + std::uint64_t{h} * group);
    attend_group(p.view, access, p.layer, p.slot, h, q + first * head_bytes, group,
                 std::uint64_t{p.start} + i + 1, scale, out + first * head_bytes);
  });
  return Status::Ok();
}

}  // namespace kvvm
