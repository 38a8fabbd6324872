// The fp8 KV cache's scales as a checkpoint carries them (model.layers.{i}.self_attn.k_scale /
// v_scale, one value per layer or one per KV head, as vLLM and compressed-tensors write them):
// read into the model, refused by name when partial, misshapen or not positive, ones without
// them, and used: the same fp8 cache under other scales gives other logits.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kvvm/model/model.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "support/safetensors_writer.h"
#include "support/tiny_model.h"

namespace kvvm::model::kv_scales_test {
namespace {

// A tiny two-layer Llama with `extra` tensors beside its weights.
struct Checkpoint {
  test::TempDir dir;
  test::TinyModel tiny;
  ModelConfig config;
  std::unique_ptr<WeightFiles> files;

  explicit Checkpoint(const std::vector<test::TensorSpec>& extra) {
    std::vector<test::TensorSpec> tensors = test::tiny_model_tensors(tiny);
    tensors.insert(tensors.end(), extra.begin(), extra.end());
    test::write_safetensors(dir / "model.safetensors", tensors);
    test::write_json_file(dir / "config.json", test::tiny_config_json(tiny));
    auto loaded = load_model_config(dir.path().string());
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    if (loaded.ok()) config = *loaded;
    auto opened = WeightFiles::open_dir(dir.path().string());
    EXPECT_TRUE(opened.ok()) << opened.status().to_string();
    if (opened.ok()) files = std::move(opened).value();
  }

  Result<KvScales> scales() const {
    Result<ModelWeights> weights = bind_weights(config, *files);
    if (!weights.ok()) return weights.status();
    return kv_scales_of(*weights, config.kv_heads);
  }
};

test::TensorSpec scalar(const std::string& name, float value,
                        std::vector<std::uint64_t> shape = {}) {
  std::vector<float> values(shape.empty() ? 1 : shape[0], value);
  return {name, "F32", std::move(shape), test::f32_bytes(values)};
}

std::vector<test::TensorSpec> every_layer(float k, float v) {
  std::vector<test::TensorSpec> specs;
  for (int layer = 0; layer < 2; ++layer) {
    const std::string attn = "model.layers." + std::to_string(layer) + ".self_attn.";
    specs.push_back(scalar(attn + "k_scale", k * static_cast<float>(layer + 1)));
    specs.push_back(scalar(attn + "v_scale", v * static_cast<float>(layer + 1), {1}));
  }
  return specs;
}

TEST(KvScales, AreOnesWithoutScalesAndTheCheckpointsWithThem) {
  const Checkpoint plain({});
  Result<KvScales> ones = plain.scales();
  ASSERT_TRUE(ones.ok()) << ones.status().to_string();
  EXPECT_EQ(ones->source, KvScaleSource::kDefault);
  EXPECT_EQ(ones->k, std::vector<float>(2, 1.0f));
  EXPECT_EQ(ones->v, std::vector<float>(2, 1.0f));

  const Checkpoint scaled(every_layer(0.0125f, 0.5f));
  Result<KvScales> read = scaled.scales();
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->source, KvScaleSource::kCheckpoint);
  EXPECT_EQ(read->k, (std::vector<float>{0.0125f, 0.025f}));
  EXPECT_EQ(read->v, (std::vector<float>{0.5f, 1.0f}));
  EXPECT_NE(read->describe().find("from the checkpoint"), std::string::npos) << read->describe();
  // The model loads with them.
  Result<ModelWeights> weights = bind_weights(scaled.config, *scaled.files);
  ASSERT_TRUE(weights.ok());
  auto model = make_cpu_model(scaled.config, *weights, CpuModelOptions{});
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->kv_scales().k, read->k);
  EXPECT_EQ((*model)->kv_scales().source, KvScaleSource::kCheckpoint);
}

TEST(KvScales, PerHeadScalesAreReadAndOneValueHoldsForEveryHeadOfItsLayer) {
  std::vector<test::TensorSpec> specs = every_layer(0.1f, 0.2f);
  const std::vector<float> per_head = {0.3f, 0.5f};
  specs[1] = {"model.layers.0.self_attn.v_scale", "F32", {2}, test::f32_bytes(per_head)};
  const Checkpoint checkpoint(specs);
  Result<KvScales> read = checkpoint.scales();
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->heads, 2u);
  const float k1 = 0.1f * 2, v1 = 0.2f * 2;  // every_layer's layer 1
  EXPECT_EQ(read->k, (std::vector<float>{0.1f, 0.1f, k1, k1}));
  EXPECT_EQ(read->v, (std::vector<float>{0.3f, 0.5f, v1, v1}));
  EXPECT_EQ(read->v_of(0, 1), 0.5f);
  ASSERT_NE(read->v_heads(0), nullptr);
  EXPECT_EQ(read->v_heads(0)[1], 0.5f);
  EXPECT_NE(read->describe().find("per KV head"), std::string::npos) << read->describe();
  // The model loads with them.
  Result<ModelWeights> weights = bind_weights(checkpoint.config, *checkpoint.files);
  ASSERT_TRUE(weights.ok());
  auto model = make_cpu_model(checkpoint.config, *weights, CpuModelOptions{});
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->kv_scales().v, read->v);
}

TEST(KvScales, PartialMisshapenAndNonPositiveScalesAreRefusedByName) {
  {
    std::vector<test::TensorSpec> partial = every_layer(0.1f, 0.1f);
    partial.erase(partial.begin() + 2);  // layer 1's k_scale
    const Result<KvScales> refused = Checkpoint(partial).scales();
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("model.layers.1.self_attn.k_scale: missing"),
              std::string::npos)
        << refused.status().to_string();
  }
  {
    std::vector<test::TensorSpec> three = every_layer(0.1f, 0.1f);
    three[1] = scalar("model.layers.0.self_attn.v_scale", 0.1f, {3});  // the model has 2 KV heads
    const Result<KvScales> refused = Checkpoint(three).scales();
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("model.layers.0.self_attn.v_scale: shape [3]; a KV "
                                              "scale holds one value, or one per KV head (2)"),
              std::string::npos)
        << refused.status().to_string();
  }
  for (const float bad : {0.0f, -1.0f, NAN}) {
    std::vector<test::TensorSpec> specs = every_layer(0.1f, 0.1f);
    specs[2] = scalar("model.layers.1.self_attn.k_scale", bad);
    const Result<KvScales> refused = Checkpoint(specs).scales();
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("layer 1's k_scale"), std::string::npos)
        << refused.status().to_string();
  }
}

// The fp8 cache of one prompt under scales 1 and under 1/64: the logits differ (the scales
// reach the kernels), and set_kv_scales refuses a bad set and keeps the old one.
TEST(KvScales, TheModelsFp8CacheIsWrittenAndReadWithItsScales) {
  const Checkpoint plain({});
  Result<ModelWeights> weights = bind_weights(plain.config, *plain.files);
  ASSERT_TRUE(weights.ok());
  CpuModelOptions options;
  options.limits = {.max_step_tokens = 16, .max_chunks = 1};
  auto made = make_cpu_model(plain.config, *weights, options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Model& model = **made;
  const std::vector<std::int32_t> ids = {3, 14, 15, 92, 65, 35, 89, 79};
  auto logits_of = [&] {
    auto kv = testing::ModelKv::make(plain.config, Layout::kTokenMajor, DType::kFp8, 16, 1);
    EXPECT_TRUE(kv);
    auto slot = kv->arena().admit(ids.size());
    EXPECT_TRUE(slot.ok());
    std::vector<float> logits(plain.config.vocab_size);
    const Chunk chunk{*slot, 0, static_cast<std::uint32_t>(ids.size())};
    const Status ran =
        model.forward({ids, std::span<const Chunk>(&chunk, 1), kv->arena().view(), {}},
                      {logits.data(), nullptr, nullptr});
    EXPECT_TRUE(ran.ok()) << ran.to_string();
    return logits;
  };
  const std::vector<float> at_one = logits_of();
  KvScales small = KvScales::ones(plain.config.layers);
  small.source = KvScaleSource::kCalibrated;
  for (float& s : small.k) s = 1.0f / 64;
  for (float& s : small.v) s = 1.0f / 64;
  ASSERT_TRUE(model.set_kv_scales(small).ok());
  EXPECT_NE(logits_of(), at_one);
  KvScales bad = small;
  bad.v[1] = INFINITY;
  const Status refused = model.set_kv_scales(bad);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("layer 1's v_scale"), std::string::npos) << refused.to_string();
  EXPECT_EQ(model.kv_scales().v[1], 1.0f / 64);
}

}  // namespace
}  // namespace kvvm::model::kv_scales_test
