// An fp8 KV cache's scales measured over the first prefill (Model::calibrate_kv_scales,
// `--kv-scales calibrate`) and per-head scales at the model: the calibrating step sets each
// layer's scales to its largest |K| and |V| / 224 before the layer's append (layer 0's maxima
// are those of the float32 cache's K and V: its input does not depend on the cache), so every
// layer's stored codes peak at exactly +-224; the step's logits are those of a model given the
// measured scales; a step that starts no sequence does not calibrate; and per-head scales equal
// across heads give the logits of the layer-wide scale, to the bit. CPU here, CUDA with a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvvm/model/kv_scales.h"
#include "kvvm/model/model.h"
#include "kvvm/vmm/host_driver.h"
#include "support/tiny_model.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "kvvm/vmm/cuda_driver.h"
#endif

namespace kvvm::model::kv_calibration_test {
namespace {

constexpr std::uint32_t kContext = 64;
const std::vector<std::int32_t> kPrompt = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 83};

// One backend's model and caches of the tiny config.
struct Rig {
  Backend backend = Backend::kCpu;
  ModelConfig config;
  std::unique_ptr<testing::TinyModel> tiny;
  std::unique_ptr<Driver> driver;

  std::unique_ptr<Model> model() const {
    Result<std::unique_ptr<Model>> made = Status::Unavailable("");
    if (backend == Backend::kCpu) {
      CpuModelOptions options;
      options.limits = {.max_step_tokens = 32, .max_chunks = 2};
      made = make_cpu_model(config, tiny->weights(), options);
    } else {
      CudaModelOptions options;
      options.limits = {.max_step_tokens = 32, .max_chunks = 2};
      made = make_cuda_model(config, tiny->weights(), options);
    }
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return made.ok() ? std::move(made).value() : nullptr;
  }
  std::unique_ptr<testing::KvArena> cache(DType element) const {
    return testing::KvArena::make(*driver, config.kv_geometry(element), Layout::kTokenMajor,
                                  kContext, 2);
  }
  // Bytes of one cache row (head `head` of layer `layer`, K or V, token `t`).
  std::vector<std::uint8_t> row(const testing::KvArena& kv, SlotId slot, std::uint32_t layer,
                                std::uint32_t which, std::uint32_t head, std::uint32_t t) const {
    const KvView view = kv.arena->view();
    std::vector<std::uint8_t> bytes(std::size_t{view.head_dim} * view.element_bytes);
    const auto* at = reinterpret_cast<const void*>(view.address(slot, layer, which, head, t));
#if defined(KVVM_HAS_CUDA_KERNELS)
    if (backend == Backend::kCuda) {
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(bytes.data(), at, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      return bytes;
    }
#endif
    std::memcpy(bytes.data(), at, bytes.size());
    return bytes;
  }
  // The largest |element| of layer `layer`'s K (which 0) or V over the prompt's tokens.
  double largest(const testing::KvArena& kv, SlotId slot, std::uint32_t layer,
                 std::uint32_t which) const {
    const DType element = kv.arena->view().element;
    double most = 0;
    for (std::uint32_t t = 0; t < kPrompt.size(); ++t) {
      for (std::uint32_t h = 0; h < config.kv_heads; ++h) {
        const std::vector<std::uint8_t> bytes = row(kv, slot, layer, which, h, t);
        for (std::uint32_t d = 0; d < config.head_dim; ++d) {
          most = std::max(most, std::fabs(static_cast<double>(element_to_float(
                                    element, &bytes[d * element_bytes(element)]))));
        }
      }
    }
    return most;
  }
};

// The prompt's prefill (one chunk at position 0) into a fresh slot: the last logits.
std::vector<float> prefill(Model& model, testing::KvArena& kv, SlotId* slot_out = nullptr) {
  auto slot = kv.arena->admit(kContext);
  EXPECT_TRUE(slot.ok()) << slot.status().to_string();
  if (!slot.ok()) return {};
  if (slot_out != nullptr) *slot_out = *slot;
  std::vector<float> logits(model.config().vocab_size);
  const Chunk chunk{*slot, 0, static_cast<std::uint32_t>(kPrompt.size())};
  const Status ran =
      model.forward({kPrompt, std::span<const Chunk>(&chunk, 1), kv.arena->view(), {}},
                    {logits.data(), nullptr, nullptr});
  EXPECT_TRUE(ran.ok()) << ran.to_string();
  return logits;
}

void expect_calibration(const Rig& rig) {
  std::unique_ptr<Model> model = rig.model();
  ASSERT_TRUE(model);
  // Layer 0's true maxima: the float32 (CPU) or compute-type (CUDA) cache of the same prompt.
  const DType exact = rig.backend == Backend::kCpu ? DType::kFp32 : rig.config.dtype;
  auto plain = rig.cache(exact);
  ASSERT_TRUE(plain);
  SlotId plain_slot = 0;
  prefill(*model, *plain, &plain_slot);

  ASSERT_TRUE(model->calibrate_kv_scales().ok());
  EXPECT_TRUE(model->kv_calibration_pending());
  EXPECT_EQ(model->kv_scales().k, std::vector<float>(rig.config.layers, 1.0f));
  auto fp8 = rig.cache(DType::kFp8);
  ASSERT_TRUE(fp8);
  SlotId slot = 0;
  const std::vector<float> calibrated = prefill(*model, *fp8, &slot);
  EXPECT_FALSE(model->kv_calibration_pending());
  const KvScales scales = model->kv_scales();
  EXPECT_EQ(scales.source, KvScaleSource::kCalibrated);
  EXPECT_NE(scales.describe().find("calibrated on the first prefill"), std::string::npos);
  for (std::uint32_t which = 0; which < 2; ++which) {
    const std::vector<float>& measured = which == 0 ? scales.k : scales.v;
    const double want = rig.largest(*plain, plain_slot, 0, which) / kCalibrationRange;
    EXPECT_NEAR(measured[0], want, 1e-6 * want) << (which == 0 ? "K" : "V") << " of layer 0";
    for (std::uint32_t layer = 0; layer < rig.config.layers; ++layer) {
      EXPECT_EQ(rig.largest(*fp8, slot, layer, which), 224.0)
          << (which == 0 ? "K" : "V") << " codes of layer " << layer;
    }
  }
  // The calibrating step wrote and read with the scales it measured.
  std::unique_ptr<Model> given = rig.model();
  ASSERT_TRUE(given);
  ASSERT_TRUE(given->set_kv_scales(scales).ok());
  auto again = rig.cache(DType::kFp8);
  ASSERT_TRUE(again);
  EXPECT_EQ(prefill(*given, *again), calibrated);
}

// Per-head scales all equal to a layer's scale: the logits of that layer-wide scale.
void expect_equal_heads_are_the_layer(const Rig& rig) {
  std::unique_ptr<Model> model = rig.model();
  ASSERT_TRUE(model);
  KvScales layer_wide = KvScales::ones(rig.config.layers);
  KvScales per_head;
  per_head.heads = rig.config.kv_heads;
  for (std::uint32_t layer = 0; layer < rig.config.layers; ++layer) {
    layer_wide.k[layer] = 0.01f * static_cast<float>(layer + 1);
    layer_wide.v[layer] = 0.003f * static_cast<float>(layer + 2);
    per_head.k.insert(per_head.k.end(), rig.config.kv_heads, layer_wide.k[layer]);
    per_head.v.insert(per_head.v.end(), rig.config.kv_heads, layer_wide.v[layer]);
  }
  ASSERT_TRUE(model->set_kv_scales(layer_wide).ok());
  auto first = rig.cache(DType::kFp8);
  ASSERT_TRUE(first);
  const std::vector<float> at_layer = prefill(*model, *first);
  ASSERT_TRUE(model->set_kv_scales(per_head).ok());
  EXPECT_NE(model->kv_scales().k_heads(1), nullptr);
  auto second = rig.cache(DType::kFp8);
  ASSERT_TRUE(second);
  EXPECT_EQ(prefill(*model, *second), at_layer);
  // A head of another scale changes them (by 3: a power of two only moves e4m3's exponent,
  // which reading multiplies back).
  per_head.k[1] *= 3;
  ASSERT_TRUE(model->set_kv_scales(per_head).ok());
  auto third = rig.cache(DType::kFp8);
  ASSERT_TRUE(third);
  EXPECT_NE(prefill(*model, *third), at_layer);
  // A count that is neither one nor the KV heads is refused, naming both.
  per_head.heads = rig.config.kv_heads + 1;
  const Status refused = model->set_kv_scales(per_head);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("one per KV head (" + std::to_string(rig.config.kv_heads)),
            std::string::npos)
      << refused.to_string();
}

Rig cpu_rig() {
  Rig rig;
  rig.config = testing::tiny_config();
  rig.tiny = std::make_unique<testing::TinyModel>(rig.config, TensorDType::kF32, 11);
  auto driver = make_host_driver();
  EXPECT_TRUE(driver.ok());
  if (driver.ok()) rig.driver = std::move(driver).value();
  return rig;
}

TEST(KvCalibration, TheFirstPrefillSetsEachLayerFromItsLargestValues) {
  const Rig rig = cpu_rig();
  ASSERT_TRUE(rig.driver);
  expect_calibration(rig);
}

TEST(KvCalibration, AStepThatStartsNoSequenceLeavesItPending) {
  const Rig rig = cpu_rig();
  ASSERT_TRUE(rig.driver);
  std::unique_ptr<Model> model = rig.model();
  ASSERT_TRUE(model);
  auto kv = rig.cache(DType::kFp8);
  ASSERT_TRUE(kv);
  SlotId slot = 0;
  prefill(*model, *kv, &slot);
  ASSERT_TRUE(model->calibrate_kv_scales().ok());
  // One more token of the sequence, at position 14.
  const std::vector<std::int32_t> next = {7};
  const Chunk chunk{slot, static_cast<std::uint32_t>(kPrompt.size()), 1};
  std::vector<float> logits(rig.config.vocab_size);
  ASSERT_TRUE(model
                  ->forward({next, std::span<const Chunk>(&chunk, 1), kv->arena->view(), {}},
                            {logits.data(), nullptr, nullptr})
                  .ok());
  EXPECT_TRUE(model->kv_calibration_pending());
  EXPECT_EQ(model->kv_scales().source, KvScaleSource::kDefault);
  auto fresh = rig.cache(DType::kFp8);
  ASSERT_TRUE(fresh);
  prefill(*model, *fresh);
  EXPECT_FALSE(model->kv_calibration_pending());
  EXPECT_EQ(model->kv_scales().source, KvScaleSource::kCalibrated);
}

TEST(KvHeadScalesModel, EqualHeadsGiveTheLayerWideLogits) {
  const Rig rig = cpu_rig();
  ASSERT_TRUE(rig.driver);
  expect_equal_heads_are_the_layer(rig);
}

#if defined(KVVM_HAS_CUDA_KERNELS)

Rig cuda_rig() {
  Rig rig;
  rig.backend = Backend::kCuda;
  rig.config = testing::tiny_cuda_config(kContext);
  rig.tiny = std::make_unique<testing::TinyModel>(rig.config, TensorDType::kBf16, 12);
  auto driver = make_cuda_driver();
  if (driver.ok()) rig.driver = std::move(driver).value();
  return rig;
}

TEST(KvCalibrationCuda, TheFirstPrefillSetsEachLayerFromItsLargestValues) {
  const Rig rig = cuda_rig();
  if (!rig.driver) GTEST_SKIP() << "no CUDA device";
  expect_calibration(rig);
}

TEST(KvHeadScalesModelCuda, EqualHeadsGiveTheLayerWideLogits) {
  const Rig rig = cuda_rig();
  if (!rig.driver) GTEST_SKIP() << "no CUDA device";
  expect_equal_heads_are_the_layer(rig);
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::model::kv_calibration_test
