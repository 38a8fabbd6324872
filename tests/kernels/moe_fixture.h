// What the MoE kernels' tests share: the host's permutation (the reference the device's is held
// to), routings of chosen shapes (uniform, every token to the same experts, skewed), expert
// weights in each format with their float64 values, and a layer run on the device from host ids
// and weights (permute, gate|up, down + combine) with everything it wrote read back.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/element.h"
#include "kvvm/kernels/moe_kernels.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include <memory>

#include "support/cuda_device.h"
#include "support/device_buffer.h"
#endif

namespace kvvm::moe_kernels_test {

inline std::uint16_t to_bits(DType type, double value) {
  return type == DType::kBf16 ? kernels::float_to_bf16(static_cast<float>(value))
                              : kernels::float_to_half(static_cast<float>(value));
}
inline double from_bits(DType type, std::uint16_t bits) {
  return type == DType::kBf16 ? kernels::bf16_to_float(bits) : kernels::half_to_float(bits);
}
// The value a tensor of `type` holds after an op gives `value` (rounded through float32, as
// the kernels' float32 results are).
inline double round_to(DType type, double value) {
  return from_bits(type, to_bits(type, static_cast<float>(value)));
}
// Half the distance between `value` and its neighbours in `type` is at most this: one ulp at
// the value's magnitude, bounded below by the smallest subnormal's.
inline double ulp(DType type, double value) {
  const double relative = type == DType::kBf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  const double floor = type == DType::kBf16 ? 1e-38 : std::ldexp(1.0, -24);
  return std::fabs(value) * relative + floor;
}

// The permutation moe_permute_cuda must write, from the definition.
struct Permutation {
  std::vector<std::uint32_t> offsets, rows, slot_of_pair, active;
};
inline Permutation permute_on_host(const std::vector<std::int32_t>& ids, std::uint32_t experts,
                                   std::uint32_t tile) {
  Permutation out;
  std::vector<std::vector<std::uint32_t>> of(experts);
  for (std::uint32_t p = 0; p < ids.size(); ++p)
    of[static_cast<std::uint32_t>(ids[p])].push_back(p);
  out.offsets.assign(experts + 1, 0);
  out.slot_of_pair.assign(ids.size(), 0);
  out.active.assign(1, 0);
  for (std::uint32_t e = 0; e < experts; ++e) {
    out.offsets[e] = static_cast<std::uint32_t>(out.rows.size());
    for (const std::uint32_t p : of[e]) {
      out.slot_of_pair[p] = static_cast<std::uint32_t>(out.rows.size());
      out.rows.push_back(p);
    }
    while (out.rows.size() % tile != 0) out.rows.push_back(kMoePadRow);
    if (!of[e].empty()) {
      ++out.active[0];
      out.active.push_back(e);
    }
  }
  out.offsets[experts] = static_cast<std::uint32_t>(out.rows.size());
  return out;
}

enum class Routing { kUniform, kSameExperts, kSkewed };

// ids [tokens][top_k], distinct experts per token: uniform; every token to experts 0 .. top_k - 1
// (the rest empty); or skewed, most choices among the first quarter of the experts.
inline std::vector<std::int32_t> make_ids(std::uint32_t tokens, std::uint32_t top_k,
                                          std::uint32_t experts, Routing routing,
                                          std::mt19937& rng) {
  std::vector<std::int32_t> ids(std::size_t{tokens} * top_k);
  std::vector<std::int32_t> order(experts);
  for (std::uint32_t t = 0; t < tokens; ++t) {
    for (std::uint32_t e = 0; e < experts; ++e) order[e] = static_cast<std::int32_t>(e);
    if (routing == Routing::kUniform) {
      std::shuffle(order.begin(), order.end(), rng);
    } else if (routing == Routing::kSkewed) {
      const std::uint32_t hot = std::max(top_k, experts / 4);
      std::shuffle(order.begin(), order.begin() + hot, rng);
      if (rng() % 8 == 0) std::shuffle(order.begin(), order.end(), rng);
    }
    for (std::uint32_t j = 0; j < top_k; ++j) ids[std::size_t{t} * top_k + j] = order[j];
  }
  return ids;
}

// One expert's projection weights [rows][cols] in `format`: the stored bytes (16-bit elements
// or e4m3), block scales in the documented layout, and the values they mean.
struct ExpertWeights {
  std::uint32_t rows = 0, cols = 0, scale_row = 0;
  std::vector<std::uint8_t> bytes;
  std::vector<float> scales;
  std::vector<double> values;  // [rows][cols]
  double at(std::uint32_t r, std::uint32_t c) const { return values[std::size_t{r} * cols + c]; }
};
inline ExpertWeights make_expert(DType type, MoeWeightFormat format, std::uint32_t rows,
                                 std::uint32_t cols, std::mt19937& rng) {
  ExpertWeights w;
  w.rows = rows;
  w.cols = cols;
  w.values.resize(std::size_t{rows} * cols);
  const double spread = 1.0 / std::sqrt(static_cast<double>(cols));
  if (format == MoeWeightFormat::kNone) {
    std::normal_distribution<double> value(0.0, spread);
    w.bytes.resize(w.values.size() * 2);
    for (std::size_t i = 0; i < w.values.size(); ++i) {
      const std::uint16_t bits = to_bits(type, value(rng));
      std::memcpy(&w.bytes[2 * i], &bits, 2);
      w.values[i] = from_bits(type, bits);
    }
    return w;
  }
  // e4m3 codes of about 100, block scales that differ by powers of two (a scale read from the
  // wrong block or layout fails) around spread / 100.
  std::normal_distribution<float> code(0.0f, 100.0f);
  std::uniform_int_distribution<int> exponent(-2, 2);
  w.scale_row = ((cols + 127) / 128 + 3) / 4 * 4;
  w.scales.assign(std::size_t{(rows + 127) / 128} * w.scale_row, 0.0f);
  for (float& s : w.scales) s = static_cast<float>(std::ldexp(spread / 100.0, exponent(rng)));
  w.bytes.resize(w.values.size());
  for (std::uint32_t r = 0; r < rows; ++r) {
    for (std::uint32_t c = 0; c < cols; ++c) {
      const std::size_t i = std::size_t{r} * cols + c;
      w.bytes[i] = kernels::float_to_e4m3(code(rng));
      w.values[i] = static_cast<double>(kernels::e4m3_to_float(w.bytes[i])) *
                    w.scales[std::size_t{r / 128} * w.scale_row + c / 128];
    }
  }
  return w;
}

#if defined(KVVM_HAS_CUDA_KERNELS)

using ::kvvm::testing::DeviceBuffer;
using ::kvvm::testing::have_cuda_device;

template <typename T>
std::vector<T> download(const DeviceBuffer& buffer, std::size_t count) {
  const std::vector<std::uint8_t> bytes = buffer.download();
  std::vector<T> out(count);
  std::memcpy(out.data(), bytes.data(), count * sizeof(T));
  return out;
}

// The permutation's device buffers for `pairs` pairs, poisoned before each run.
struct DevicePermutation {
  std::uint32_t tokens = 0, top_k = 0, experts = 0, tile = 0;
  std::uint64_t capacity = 0;
  DeviceBuffer ids, offsets, rows, slot_of_pair, active;
  DevicePermutation(std::uint32_t tokens_, std::uint32_t top_k_, std::uint32_t experts_,
                    std::uint32_t tile_)
      : tokens(tokens_),
        top_k(top_k_),
        experts(experts_),
        tile(tile_),
        capacity(moe_permuted_rows(tokens_, top_k_, experts_, tile_)),
        ids(std::size_t{tokens_} * top_k_ * 4),
        offsets((experts_ + 1) * 4),
        rows(capacity * 4),
        slot_of_pair(std::size_t{tokens_} * top_k_ * 4),
        active((experts_ + 1) * 4) {}
  MoePermuteParams params() const {
    MoePermuteParams p;
    p.tokens = tokens;
    p.top_k = top_k;
    p.experts = experts;
    p.tile = tile;
    p.ids = static_cast<const std::int32_t*>(ids.get());
    p.offsets = static_cast<std::uint32_t*>(offsets.get());
    p.rows = static_cast<std::uint32_t*>(rows.get());
    p.slot_of_pair = static_cast<std::uint32_t*>(slot_of_pair.get());
    p.active = static_cast<std::uint32_t*>(active.get());
    return p;
  }
  void poison() {
    offsets.poison();
    rows.poison();
    slot_of_pair.poison();
    active.poison();
  }
  // What the device wrote: rows up to offsets[experts], active up to its count.
  Permutation read() const {
    Permutation out;
    out.offsets = download<std::uint32_t>(offsets, experts + 1);
    const std::uint32_t used = out.offsets[experts];
    out.rows = download<std::uint32_t>(rows, used <= capacity ? used : capacity);
    out.slot_of_pair = download<std::uint32_t>(slot_of_pair, std::size_t{tokens} * top_k);
    out.active = download<std::uint32_t>(active, experts + 1);
    if (out.active[0] <= experts) out.active.resize(1 + out.active[0]);
    return out;
  }
};

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace kvvm::moe_kernels_test
