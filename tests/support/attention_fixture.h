// The parameterized attention suites' common ground: the matrix of configurations (layout x
// element type x head dim x group size) with test names made of them, a fixture holding the
// driver and a seeded random source, random K and V rows, and AppendParams for them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/kv/layout.h"
#include "kvvm/vmm/driver.h"
#include "support/attention_support.h"
#include "support/pattern.h"
#include "support/sanitizer.h"

namespace kvvm::testing {

struct AttentionConfig {
  Layout layout;
  DType element;  // of the activations, and of the cache unless fp8
  std::uint32_t head_dim;
  std::uint32_t group;  // query heads per KV head
  bool fp8 = false;     // the cache holds e4m3 (with kFp8KScale / kFp8VScale)
};

// The scales of the fp8 configurations: random elements in [-1, 1] (K) and [-2, 2] (queries)
// stay well inside e4m3's +-448 after division, and neither scale is a power of two.
inline constexpr float kFp8KScale = 0.0123f;
inline constexpr float kFp8VScale = 0.00731f;

// The layout's name without dashes, as a test name allows.
inline std::string layout_test_name(Layout layout) {
  std::string name(to_string(layout));
  name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
  return name;
}

inline std::string attention_config_name(const ::testing::TestParamInfo<AttentionConfig>& info) {
  const AttentionConfig& c = info.param;
  return layout_test_name(c.layout) + (c.element == DType::kBf16 ? "_bf16" : "_fp16") + "_d" +
         std::to_string(c.head_dim) + "_g" + std::to_string(c.group) + (c.fp8 ? "_fp8kv" : "");
}

// `configs` with an e4m3 cache.
inline std::vector<AttentionConfig> with_fp8_cache(std::vector<AttentionConfig> configs) {
  for (AttentionConfig& c : configs) c.fp8 = true;
  return configs;
}

// Every layout x fp16 / bf16 x head dim 64 / 128 x group sizes 1, 4, 7, 8.
inline std::vector<AttentionConfig> all_attention_configs() {
  std::vector<AttentionConfig> configs;
  for (Layout layout : all_layouts()) {
    for (DType element : {DType::kFp16, DType::kBf16}) {
      for (std::uint32_t dim : {64u, 128u}) {
        for (std::uint32_t group : {1u, 4u, 7u, 8u}) {
          configs.push_back({layout, element, dim, group});
        }
      }
    }
  }
  return configs;
}

// The configurations of all_attention_configs() whose group size is one of `groups`.
inline std::vector<AttentionConfig> attention_configs_with_groups(
    const std::vector<std::uint32_t>& groups) {
  std::vector<AttentionConfig> chosen;
  for (const AttentionConfig& c : all_attention_configs()) {
    if (std::find(groups.begin(), groups.end(), c.group) != groups.end()) chosen.push_back(c);
  }
  return chosen;
}

// `configs` (ordered by layout first, as made above), or under ThreadSanitizer the last of each
// layout's: bf16 at the largest head dimension and group, the most work for each thread.
inline std::vector<AttentionConfig> sampled_under_thread_sanitizer(
    const std::vector<AttentionConfig>& configs) {
  if (!test::kUnderThreadSanitizer) return configs;
  std::vector<AttentionConfig> sampled;
  for (const AttentionConfig& c : configs) {
    if (!sampled.empty() && sampled.back().layout == c.layout) {
      sampled.back() = c;
    } else {
      sampled.push_back(c);
    }
  }
  return sampled;
}

// Appends `tokens` rows of K and V (each [tokens][kv_heads][head_dim]) at `layer` of `view`;
// the caller names where: slot and start, or row_slots and row_positions.
inline AppendParams append_rows(const KvView& view, std::uint32_t layer, std::uint32_t kv_heads,
                                std::uint32_t tokens, const void* k, const void* v) {
  AppendParams append;
  append.view = view;
  append.layer = layer;
  append.kv_heads = kv_heads;
  append.tokens = tokens;
  append.k = k;
  append.v = v;
  return append;
}

// Random K and V rows, K drawn first.
struct KvRows {
  std::vector<std::uint8_t> k;
  std::vector<std::uint8_t> v;
};
inline KvRows random_kv_rows(DType element, std::size_t elements, std::mt19937_64& random) {
  KvRows rows;
  rows.k = random_elements(element, elements, random);
  rows.v = random_elements(element, elements, random);
  return rows;
}

// The geometry every configuration runs on: two layers (layer 1 is used, so the layer stride
// is exercised) of two KV heads.
inline constexpr std::uint32_t kAttentionLayers = 2;
inline constexpr std::uint32_t kAttentionKvHeads = 2;
inline constexpr std::uint32_t kAttentionLayer = 1;

// A suite's SetUp makes driver_ (or skips) and calls seed_random().
class AttentionFixture : public ::testing::TestWithParam<AttentionConfig> {
 protected:
  Geometry geometry() const {
    const AttentionConfig& c = GetParam();
    return Geometry{"attention-test", kAttentionLayers, kAttentionKvHeads, c.head_dim,
                    c.fp8 ? DType::kFp8 : dtype_of(c.element)};
  }
  // Bytes of one cached row of one head.
  std::size_t cache_row_bytes() const {
    return std::size_t{GetParam().head_dim} * geometry().element_bytes();
  }
  // The activations' type and the scales, on an fp8 configuration's call.
  template <typename Params>
  void set_access(Params& params) const {
    const AttentionConfig& c = GetParam();
    if (!c.fp8) return;
    params.activations = c.element;
    params.k_scale = kFp8KScale;
    params.v_scale = kFp8VScale;
  }
  void seed_random() {
    seed_ = fresh_seed();
    random_.seed(seed_);
  }
  // Random K and V for `tokens` tokens of every KV head.
  KvRows random_rows(std::uint32_t tokens) {
    const AttentionConfig& c = GetParam();
    return random_kv_rows(c.element, std::size_t{tokens} * kAttentionKvHeads * c.head_dim, random_);
  }

  std::unique_ptr<Driver> driver_;
  std::uint64_t seed_ = 0;
  std::mt19937_64 random_;
};

}  // namespace kvvm::testing
