// Per-KV-head scales of an fp8 cache (KvHeadScales), on the CPU paths and (with a GPU) the
// CUDA kernels: a cache written and read with per-head scales {s0, s1} holds, for KV head h,
// exactly the bytes of a cache written with the layer-wide scale s_h, and the attention output
// of the query heads over KV head h is the one computed with s_h, to the bit (the kernels
// multiply by a head's scale where they multiplied by the layer's). The per-layer path itself
// is checked against the float64 reference by the attention suites' Fp8 instantiations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/vmm/host_driver.h"
#include "support/attention_support.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "kvvm/vmm/cuda_driver.h"
#include "support/device_buffer.h"
#endif

namespace kvvm::attention_fp8_head_scales_test {
namespace {

constexpr std::uint32_t kDim = 64, kKvHeads = 2, kQoHeads = 4, kTokens = 40;
constexpr float kK[kKvHeads] = {0.011f, 0.047f};
constexpr float kV[kKvHeads] = {0.023f, 0.005f};

// One backend's memory and calls: host vectors and the CPU paths, or device buffers and the
// CUDA kernels.
struct Side {
  bool cuda = false;
  std::unique_ptr<Driver> driver;
  std::deque<std::vector<std::uint8_t>> host;
#if defined(KVVM_HAS_CUDA_KERNELS)
  std::deque<testing::DeviceBuffer> device;
#endif

  void* put(const std::vector<std::uint8_t>& bytes) {
#if defined(KVVM_HAS_CUDA_KERNELS)
    if (cuda) return device.emplace_back(bytes).get();
#endif
    return host.emplace_back(bytes).data();
  }
  std::vector<std::uint8_t> get(const void* at, std::size_t bytes) const {
    std::vector<std::uint8_t> out(bytes);
#if defined(KVVM_HAS_CUDA_KERNELS)
    if (cuda) {
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(out.data(), at, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      return out;
    }
#endif
    std::memcpy(out.data(), at, bytes);
    return out;
  }
  Status append(const AppendParams& p) {
#if defined(KVVM_HAS_CUDA_KERNELS)
    if (cuda) return append_kv_cuda(p, nullptr);
#endif
    return append_kv_cpu(p);
  }
  Status decode(const DecodeParams& p) {
#if defined(KVVM_HAS_CUDA_KERNELS)
    if (cuda) return decode_attention_cuda(p, nullptr, 0, nullptr);
#endif
    return decode_attention_cpu(p);
  }
  Status prefill(const PrefillParams& p) {
#if defined(KVVM_HAS_CUDA_KERNELS)
    if (cuda) return prefill_attention_cuda(p, nullptr);
#endif
    return prefill_attention_cpu(p);
  }
};

std::vector<std::uint8_t> random_bf16(std::size_t count, std::uint64_t seed, float spread) {
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<float> draw(-spread, spread);
  std::vector<std::uint8_t> bytes(count * 2);
  for (std::size_t i = 0; i < count; ++i)
    float_to_element(DType::kBf16, draw(random), &bytes[2 * i]);
  return bytes;
}

// A one-layer fp8 cache of two KV heads with the prompt's K and V appended, and the prefill
// and decode outputs of the prompt's queries over it.
struct Written {
  std::unique_ptr<testing::KvArena> kv;
  std::uint32_t slot = 0;
  std::vector<std::uint8_t> prefill_out;  // [kTokens][kQoHeads][kDim] bf16
  std::vector<std::uint8_t> decode_out;   // [kQoHeads][kDim] bf16: the last token again
};

// head_scales: the per-head scales (on the side's memory) or none, then k_scale / v_scale.
Written write_and_attend(Side& side, Layout layout, KvHeadScales head_scales, float k_scale,
                         float v_scale) {
  Written w;
  w.kv = testing::KvArena::make(*side.driver, Geometry{"fp8", 1, kKvHeads, kDim, DType::kFp8},
                                layout, kTokens, 1);
  EXPECT_TRUE(w.kv);
  if (!w.kv) return w;
  auto slot = w.kv->arena->admit(kTokens);
  EXPECT_TRUE(slot.ok()) << slot.status().to_string();
  if (!slot.ok()) return w;
  w.slot = *slot;
  const KvView view = w.kv->arena->view();
  // Magnitudes to ~3: per-head scales of 0.005..0.047 put them across e4m3's range.
  const void* k = side.put(random_bf16(std::size_t{kTokens} * kKvHeads * kDim, 1, 3.0f));
  const void* v = side.put(random_bf16(std::size_t{kTokens} * kKvHeads * kDim, 2, 1.0f));
  const void* q = side.put(random_bf16(std::size_t{kTokens} * kQoHeads * kDim, 3, 2.0f));
  const std::size_t out_bytes = std::size_t{kTokens} * kQoHeads * kDim * 2;
  void* out = side.put(std::vector<std::uint8_t>(out_bytes));

  AppendParams append;
  append.view = view;
  append.activations = DType::kBf16;
  append.k_scale = k_scale;
  append.v_scale = v_scale;
  append.head_scales = head_scales;
  append.kv_heads = kKvHeads;
  append.tokens = kTokens;
  append.k = k;
  append.v = v;
  append.slot = w.slot;
  const Status appended = side.append(append);
  EXPECT_TRUE(appended.ok()) << appended.to_string();

  PrefillParams prefill;
  prefill.view = view;
  prefill.activations = DType::kBf16;
  prefill.k_scale = k_scale;
  prefill.v_scale = v_scale;
  prefill.head_scales = head_scales;
  prefill.qo_heads = kQoHeads;
  prefill.kv_heads = kKvHeads;
  prefill.slot = w.slot;
  prefill.tokens = kTokens;
  prefill.q = q;
  prefill.out = out;
  const Status prefilled = side.prefill(prefill);
  EXPECT_TRUE(prefilled.ok()) << prefilled.to_string();
  w.prefill_out = side.get(out, out_bytes);

  const std::uint32_t length = kTokens;
  DecodeParams decode;
  decode.view = view;
  decode.activations = DType::kBf16;
  decode.k_scale = k_scale;
  decode.v_scale = v_scale;
  decode.head_scales = head_scales;
  decode.qo_heads = kQoHeads;
  decode.kv_heads = kKvHeads;
  decode.batch = 1;
  decode.q = static_cast<const std::uint8_t*>(q) + out_bytes - std::size_t{kQoHeads} * kDim * 2;
  decode.slots = static_cast<const std::uint32_t*>(
      side.put(std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(&w.slot),
                                         reinterpret_cast<const std::uint8_t*>(&w.slot) + 4)));
  decode.lengths = static_cast<const std::uint32_t*>(
      side.put(std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(&length),
                                         reinterpret_cast<const std::uint8_t*>(&length) + 4)));
  decode.max_length = kTokens;
  decode.chunk_tokens = 256;  // CUDA: one chunk, no split workspace
  decode.out = out;
  const Status decoded = side.decode(decode);
  EXPECT_TRUE(decoded.ok()) << decoded.to_string();
  w.decode_out = side.get(out, std::size_t{kQoHeads} * kDim * 2);
  return w;
}

void expect_heads_equal_layer_wide(Side& side) {
  std::vector<std::uint8_t> scales(4 * kKvHeads * sizeof(float));
  std::memcpy(scales.data(), kK, sizeof(kK));
  std::memcpy(scales.data() + sizeof(kK), kV, sizeof(kV));
  const auto* table = static_cast<const float*>(side.put(scales));
  for (const Layout layout : {Layout::kTokenMajor, Layout::kHeadMajor, Layout::kSeqMajor}) {
    SCOPED_TRACE(std::string(to_string(layout)));
    const Written per_head =
        write_and_attend(side, layout, KvHeadScales{table, table + kKvHeads}, 1.0f, 1.0f);
    ASSERT_TRUE(per_head.kv);
    for (std::uint32_t h = 0; h < kKvHeads; ++h) {
      const Written layer_wide = write_and_attend(side, layout, KvHeadScales{}, kK[h], kV[h]);
      ASSERT_TRUE(layer_wide.kv);
      for (std::uint32_t t = 0; t < kTokens; ++t) {
        for (std::uint32_t kv = 0; kv < 2; ++kv) {
          const auto row = [&](const Written& w) {
            return side.get(
                reinterpret_cast<const void*>(w.kv->arena->view().address(w.slot, 0, kv, h, t)),
                kDim);
          };
          ASSERT_EQ(row(per_head), row(layer_wide))
              << "KV head " << h << " token " << t << (kv == 0 ? " K" : " V");
        }
      }
      // Query heads 2h and 2h + 1 read KV head h.
      const std::size_t head_bytes = std::size_t{kDim} * 2;
      for (std::uint32_t t = 0; t < kTokens; ++t) {
        const std::size_t at = (std::size_t{t} * kQoHeads + 2 * h) * head_bytes;
        ASSERT_EQ(0, std::memcmp(per_head.prefill_out.data() + at,
                                 layer_wide.prefill_out.data() + at, 2 * head_bytes))
            << "prefill, KV head " << h << " query row " << t;
      }
      const std::size_t at = std::size_t{2} * h * head_bytes;
      EXPECT_EQ(0, std::memcmp(per_head.decode_out.data() + at, layer_wide.decode_out.data() + at,
                               2 * head_bytes))
          << "decode, KV head " << h;
    }
  }
}

TEST(Fp8HeadScales, EachHeadIsWrittenAndReadAsWithItsScaleLayerWideOnTheCpu) {
  Side side;
  auto driver = make_host_driver();
  ASSERT_TRUE(driver.ok());
  side.driver = std::move(driver).value();
  expect_heads_equal_layer_wide(side);
}

TEST(Fp8HeadScales, HalfASetAndABadValueAreRefusedByName) {
  auto driver = make_host_driver();
  ASSERT_TRUE(driver.ok());
  auto kv = testing::KvArena::make(**driver, Geometry{"fp8", 1, kKvHeads, kDim, DType::kFp8},
                                   Layout::kTokenMajor, 16, 1);
  ASSERT_TRUE(kv);
  auto slot = kv->arena->admit(16);
  ASSERT_TRUE(slot.ok()) << slot.status().to_string();
  std::vector<float> rows(std::size_t{kKvHeads} * kDim, 1.0f);
  float k[kKvHeads] = {0.5f, 0.25f};
  float v[kKvHeads] = {0.5f, std::numeric_limits<float>::quiet_NaN()};
  AppendParams append;
  append.view = kv->arena->view();
  append.activations = DType::kFp32;
  append.kv_heads = kKvHeads;
  append.tokens = 1;
  append.k = append.v = rows.data();
  append.slot = *slot;
  append.head_scales.k = k;
  Status refused = append_kv_cpu(append);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("append: per-head scales for K only; give both or neither"),
            std::string::npos)
      << refused.to_string();
  append.head_scales.v = v;
  refused = append_kv_cpu(append);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("KV head 1's v scale nan is not a finite positive scale"),
            std::string::npos)
      << refused.to_string();
  v[1] = 0.125f;
  EXPECT_TRUE(append_kv_cpu(append).ok());
}

#if defined(KVVM_HAS_CUDA_KERNELS)

TEST(Fp8HeadScalesCuda, EachHeadIsWrittenAndReadAsWithItsScaleLayerWide) {
  Side side;
  side.cuda = true;
  auto driver = make_cuda_driver();
  if (!driver.ok()) GTEST_SKIP() << "no CUDA device: " << driver.status().to_string();
  side.driver = std::move(driver).value();
  expect_heads_equal_layer_wide(side);
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::attention_fp8_head_scales_test
