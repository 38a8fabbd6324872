// FP8 checkpoints on the CPU backend: a small Qwen3 written in both formats kvvm reads
// (Hugging Face's "fp8", e4m3 weights with one scale per 128 x 128 block in weight_scale_inv;
// compressed-tensors' FP8-dynamic, one scale per output row in weight_scale), with F32 and BF16
// scales, loaded through config.json, the safetensors reader and the binder. The CPU backend
// dequantizes at load: its float32 weights must equal e4m3 * scale as this test computes it
// (decoding e4m3 from the format's definition), and its logits those of an unquantized F32
// checkpoint holding the dequantized values. Every malformed checkpoint is refused naming the
// tensor or the config field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kernels/element.h"
#include "kvvm/model/config.h"
#include "kvvm/model/model.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "model/cpu/cpu_weights.h"
#include "model/weights/weight_layout.h"
#include "model/weights/weight_tensors.h"
#include "support/safetensors_writer.h"
#include "support/text_match.h"
#include "support/tiny_model.h"

namespace kvvm {
namespace {

namespace fs = std::filesystem;
using model::WeightQuant;
using test::contains;
using test::TensorSpec;

constexpr std::uint64_t kBlock = 128;

// The value of an e4m3 ("fn") byte from the format's definition: sign, 4 exponent bits with
// bias 7, 3 mantissa bits; exponent 0 is subnormal (m * 2^-9). The saturating encoder never
// writes the NaN codes.
float e4m3_value(std::uint8_t b) {
  const int exponent = (b >> 3) & 0xf, mantissa = b & 0x7;
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(8.0f + mantissa, exponent - 10);
  return (b & 0x80) != 0 ? -magnitude : magnitude;
}

std::vector<float> floats_of(const TensorSpec& t) {
  std::vector<float> values(t.bytes.size() / 4);
  std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
  return values;
}

bool is_projection(const std::string& name) {
  for (const char* suffix : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                             "gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

std::string scale_name(const std::string& weight, WeightQuant quant) {
  const std::string module = weight.substr(0, weight.size() - std::string(".weight").size());
  return module + (quant == WeightQuant::kFp8Block ? ".weight_scale_inv" : ".weight_scale");
}

// Hugging Face's and compressed-tensors' quantization_config for `quant`.
nlohmann::json quantization_config(WeightQuant quant) {
  if (quant == WeightQuant::kFp8Block) {
    return {{"quant_method", "fp8"},
            {"activation_scheme", "dynamic"},
            {"weight_block_size", {128, 128}},
            {"modules_to_not_convert", {"lm_head"}}};
  }
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"quantization_status", "compressed"},
          {"ignore", {"lm_head"}},
          {"config_groups",
           {{"group_0",
             {{"weights",
               {{"num_bits", 8},
                {"type", "float"},
                {"strategy", "channel"},
                {"symmetric", true},
                {"dynamic", false}}},
              {"input_activations",
               {{"num_bits", 8},
                {"type", "float"},
                {"strategy", "token"},
                {"symmetric", true},
                {"dynamic", true}}},
              {"targets", {"Linear"}}}}}}};
}

struct Checkpoint {
  nlohmann::json config;
  std::vector<TensorSpec> tensors;

  TensorSpec& tensor(const std::string& name) {
    for (TensorSpec& t : tensors) {
      if (t.name == name) return t;
    }
    throw std::runtime_error(name + " is not in the checkpoint");
  }
  void erase(const std::string& name) {
    std::erase_if(tensors, [&](const TensorSpec& t) { return t.name == name; });
  }
};

// A quantized checkpoint, the same model unquantized with its projections' dequantized values
// in F32, and those values by tensor name.
struct Pair {
  Checkpoint quantized;
  Checkpoint dequantized;
  std::map<std::string, std::vector<float>> values;
};

// q 256 x 256, k / v 128 x 256, o 256 x 256, gate / up 320 x 256, down 256 x 320: the
// intermediate size ends in a partial block of 64 rows (gate, up) and columns (down).
test::TinyModel tiny_qwen3() {
  test::TinyModel tiny;
  tiny.architecture = "Qwen3ForCausalLM";
  tiny.hidden = 256;
  tiny.intermediate = 320;
  tiny.layers = 2;
  tiny.heads = 4;
  tiny.kv_heads = 2;
  tiny.head_dim = 64;
  tiny.vocab = 96;
  tiny.seed = 3;
  return tiny;
}

// Quantizes every projection of the tiny model. Its weights are first spread over rows and
// blocks (a factor per 128 x 128 block times one per row), so that every block's and every
// row's scale differs and one read for another shows.
Pair make_pair(WeightQuant quant, const std::string& scale_dtype) {
  const test::TinyModel tiny = tiny_qwen3();
  Pair pair;
  pair.dequantized.config = test::tiny_config_json(tiny);
  pair.quantized.config = pair.dequantized.config;
  pair.quantized.config["torch_dtype"] = "bfloat16";
  pair.quantized.config["quantization_config"] = quantization_config(quant);
  for (const TensorSpec& t : test::tiny_model_tensors(tiny)) {
    if (!is_projection(t.name)) {
      pair.quantized.tensors.push_back(t);
      pair.dequantized.tensors.push_back(t);
      continue;
    }
    const std::uint64_t rows = t.shape[0], in = t.shape[1];
    std::vector<float> w = floats_of(t);
    for (std::uint64_t r = 0; r < rows; ++r) {
      for (std::uint64_t c = 0; c < in; ++c) {
        const float block =
            1.0f + 0.75f * static_cast<float>(r / kBlock) + 1.5f * static_cast<float>(c / kBlock);
        w[r * in + c] *= block * (1.0f + 0.25f * static_cast<float>(r % 4));
      }
    }
    // One scale per block or row: its largest magnitude over 448, rounded to the scale's dtype.
    const std::uint64_t block_rows = quant == WeightQuant::kFp8Block ? kBlock : 1;
    const std::uint64_t block_cols = quant == WeightQuant::kFp8Block ? kBlock : in;
    const std::uint64_t grid_rows = (rows + block_rows - 1) / block_rows;
    const std::uint64_t grid_cols = (in + block_cols - 1) / block_cols;
    std::vector<float> scales(grid_rows * grid_cols, 0.0f);
    for (std::uint64_t r = 0; r < rows; ++r) {
      for (std::uint64_t c = 0; c < in; ++c) {
        float& s = scales[(r / block_rows) * grid_cols + c / block_cols];
        s = std::max(s, std::fabs(w[r * in + c]) / 448.0f);
      }
    }
    std::vector<std::byte> scale_bytes = test::f32_bytes(scales);
    if (scale_dtype == "BF16") {
      scale_bytes = test::bf16_bytes(scales);
      for (std::size_t i = 0; i < scales.size(); ++i) {
        scales[i] = kernels::bf16_to_float(
            static_cast<std::uint16_t>(std::to_integer<unsigned>(scale_bytes[2 * i]) |
                                       std::to_integer<unsigned>(scale_bytes[2 * i + 1]) << 8));
      }
    }
    std::vector<std::byte> codes(rows * in);
    std::vector<float>& values = pair.values[t.name];
    values.resize(rows * in);
    for (std::uint64_t r = 0; r < rows; ++r) {
      for (std::uint64_t c = 0; c < in; ++c) {
        const float s = scales[(r / block_rows) * grid_cols + c / block_cols];
        const std::uint8_t code = kernels::float_to_e4m3(w[r * in + c] / s);
        codes[r * in + c] = std::byte{code};
        values[r * in + c] = e4m3_value(code) * s;
      }
    }
    pair.quantized.tensors.push_back({t.name, "F8_E4M3", t.shape, std::move(codes)});
    const std::vector<std::uint64_t> scale_shape =
        quant == WeightQuant::kFp8Block ? std::vector<std::uint64_t>{grid_rows, grid_cols}
                                        : std::vector<std::uint64_t>{rows, 1};
    pair.quantized.tensors.push_back(
        {scale_name(t.name, quant), scale_dtype, scale_shape, std::move(scale_bytes)});
    pair.dequantized.tensors.push_back({t.name, "F32", t.shape, test::f32_bytes(values)});
  }
  return pair;
}

struct Fp8Loaded {
  model::ModelConfig config;
  std::unique_ptr<model::WeightFiles> files;
  model::ModelWeights weights;
};

// Writes the checkpoint to DIR and loads it as a user's would.
Result<Fp8Loaded> load(const Checkpoint& checkpoint, const fs::path& dir) {
  fs::create_directories(dir);
  test::write_json_file(dir / "config.json", checkpoint.config);
  test::write_safetensors(dir / "model.safetensors", checkpoint.tensors,
                          nlohmann::json{{"format", "pt"}});
  Fp8Loaded loaded;
  Result<model::ModelConfig> config = model::load_model_config(dir.string());
  if (!config.ok()) return config.status();
  loaded.config = *config;
  Result<std::unique_ptr<model::WeightFiles>> files = model::WeightFiles::open_dir(dir.string());
  if (!files.ok()) return files.status();
  loaded.files = std::move(files).value();
  Result<model::ModelWeights> weights = model::bind_weights(loaded.config, *loaded.files);
  if (!weights.ok()) return weights.status();
  loaded.weights = *weights;
  return loaded;
}

// Why the checkpoint is refused (empty, with a failure, when it loads).
std::string refusal(const Checkpoint& checkpoint) {
  test::TempDir dir;
  Result<Fp8Loaded> loaded = load(checkpoint, dir / "model");
  EXPECT_FALSE(loaded.ok()) << "loaded";
  if (loaded.ok()) return "";
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  return loaded.status().message();
}

// The last position's logits of a 24-token prompt run by the CPU model.
std::vector<float> last_logits(const model::ModelConfig& config, const model::ModelWeights& weights,
                               model::LoadFormat format = model::LoadFormat::kCheckpoint) {
  std::vector<std::int32_t> tokens;
  for (std::int32_t i = 0; i < 24; ++i) tokens.push_back((i * 37 + 5) % 96);
  model::CpuModelOptions options;
  options.limits = {.max_step_tokens = 32, .max_chunks = 1};
  options.weights.format = format;
  options.weights.dummy_seed = 11;
  auto made = model::make_cpu_model(config, weights, options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (!made.ok()) return {};
  auto kv = testing::ModelKv::make(config, Layout::kTokenMajor, DType::kFp32, 32, 1);
  if (kv == nullptr) return {};
  auto slot = kv->arena().admit(tokens.size());
  EXPECT_TRUE(slot.ok()) << slot.status().to_string();
  if (!slot.ok()) return {};
  std::vector<float> logits(config.vocab_size, NAN);
  const model::Chunk chunk{*slot, 0, static_cast<std::uint32_t>(tokens.size())};
  const Status status =
      (*made)->forward({tokens, std::span<const model::Chunk>(&chunk, 1), kv->arena().view(), {}},
                       {logits.data(), nullptr, nullptr});
  EXPECT_TRUE(status.ok()) << status.to_string();
  return logits;
}

struct Fp8Case {
  WeightQuant quant;
  std::string scale_dtype;
};

class ModelFp8Weights : public ::testing::TestWithParam<Fp8Case> {
 protected:
  void SetUp() override { pair_ = make_pair(GetParam().quant, GetParam().scale_dtype); }

  Pair pair_;
  test::TempDir dir_;
};

TEST_P(ModelFp8Weights, TheCpuBackendHoldsE4m3TimesItsScale) {
  Result<Fp8Loaded> loaded = load(pair_.quantized, dir_ / "fp8");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->config.weight_quant, GetParam().quant);
  for (const model::LayerWeights& layer : loaded->weights.layers) {
    for (const model::TensorView* scale :
         {layer.q_weight_scale, layer.k_weight_scale, layer.v_weight_scale, layer.o_weight_scale,
          layer.gate_weight_scale, layer.up_weight_scale, layer.down_weight_scale}) {
      ASSERT_NE(scale, nullptr);
      EXPECT_EQ(std::string(model::to_string(scale->dtype)), GetParam().scale_dtype);
    }
    EXPECT_EQ(layer.q->dtype, model::TensorDType::kF8E4M3);
  }
  auto weights = model::cpu::CpuWeights::load(loaded->config, loaded->weights, {});
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  for (std::uint32_t l = 0; l < loaded->config.layers; ++l) {
    const model::cpu::CpuLayerWeights& got = (*weights)->layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::pair<const char*, const float*> projections[] = {
        {"self_attn.q_proj.weight", got.q}, {"self_attn.k_proj.weight", got.k},
        {"self_attn.v_proj.weight", got.v}, {"self_attn.o_proj.weight", got.o},
        {"mlp.gate_proj.weight", got.gate}, {"mlp.up_proj.weight", got.up},
        {"mlp.down_proj.weight", got.down}};
    for (const auto& [name, at] : projections) {
      const std::vector<float>& want = pair_.values.at(p + name);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < want.size(); ++i) differ += at[i] != want[i];
      EXPECT_EQ(differ, 0u) << p << name << ": " << differ << " of " << want.size()
                            << " values differ from e4m3 * scale";
    }
  }
}

TEST_P(ModelFp8Weights, LogitsEqualThoseOfTheDequantizedCheckpoint) {
  Result<Fp8Loaded> fp8 = load(pair_.quantized, dir_ / "fp8");
  ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
  Result<Fp8Loaded> f32 = load(pair_.dequantized, dir_ / "f32");
  ASSERT_TRUE(f32.ok()) << f32.status().to_string();
  EXPECT_EQ(f32->config.weight_quant, WeightQuant::kNone);
  const std::vector<float> got = last_logits(fp8->config, fp8->weights);
  const std::vector<float> want = last_logits(f32->config, f32->weights);
  ASSERT_EQ(got.size(), want.size());
  float largest = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "logit " << i;
    largest = std::max(largest, std::fabs(want[i]));
  }
  EXPECT_GT(largest, 0.0f);
}

std::string fp8_case_name(const ::testing::TestParamInfo<Fp8Case>& param) {
  return std::string(param.param.quant == WeightQuant::kFp8Block ? "Block" : "Channel") +
         param.param.scale_dtype + "Scales";
}

INSTANTIATE_TEST_SUITE_P(Formats, ModelFp8Weights,
                         ::testing::Values(Fp8Case{WeightQuant::kFp8Block, "F32"},
                                           Fp8Case{WeightQuant::kFp8Block, "BF16"},
                                           Fp8Case{WeightQuant::kFp8Channel, "F32"},
                                           Fp8Case{WeightQuant::kFp8Channel, "BF16"}),
                         fp8_case_name);

TEST(ModelFp8Refusal, AMissingScale) {
  Pair pair = make_pair(WeightQuant::kFp8Block, "F32");
  pair.quantized.erase("model.layers.1.mlp.down_proj.weight_scale_inv");
  const std::string message = refusal(pair.quantized);
  EXPECT_TRUE(contains(message, "model.layers.1.mlp.down_proj.weight_scale_inv: missing"))
      << message;
  EXPECT_TRUE(contains(message, "[2, 3]")) << message;  // the shape it needs

  pair = make_pair(WeightQuant::kFp8Channel, "F32");
  pair.quantized.erase("model.layers.0.self_attn.v_proj.weight_scale");
  EXPECT_TRUE(contains(refusal(pair.quantized), "model.layers.0.self_attn.v_proj.weight_scale"));
}

TEST(ModelFp8Refusal, AScaleOfTheWrongShapeOrDtype) {
  Pair pair = make_pair(WeightQuant::kFp8Block, "F32");
  TensorSpec& scale = pair.quantized.tensor("model.layers.0.self_attn.q_proj.weight_scale_inv");
  scale.shape = {1, 4};  // 2 x 2 blocks, 4 floats
  std::string message = refusal(pair.quantized);
  EXPECT_TRUE(contains(message, "model.layers.0.self_attn.q_proj.weight_scale_inv: shape [1, 4]"))
      << message;
  EXPECT_TRUE(contains(message, "[2, 2]")) << message;

  // Per channel the scale is a column [out, 1], as compressed-tensors stores it.
  pair = make_pair(WeightQuant::kFp8Channel, "F32");
  pair.quantized.tensor("model.layers.1.mlp.gate_proj.weight_scale").shape = {320};
  message = refusal(pair.quantized);
  EXPECT_TRUE(contains(message, "model.layers.1.mlp.gate_proj.weight_scale: shape [320]"))
      << message;
  EXPECT_TRUE(contains(message, "[320, 1]")) << message;

  pair = make_pair(WeightQuant::kFp8Channel, "F32");
  TensorSpec& wide = pair.quantized.tensor("model.layers.0.mlp.up_proj.weight_scale");
  wide.dtype = "I32";
  message = refusal(pair.quantized);
  EXPECT_TRUE(contains(message, "model.layers.0.mlp.up_proj.weight_scale: dtype I32")) << message;
}

TEST(ModelFp8Refusal, AWeightNotInF8WhereTheConfigQuantizes) {
  Pair pair = make_pair(WeightQuant::kFp8Block, "F32");
  TensorSpec& k = pair.quantized.tensor("model.layers.0.self_attn.k_proj.weight");
  std::vector<std::byte> half(k.bytes.size() * 2);
  for (std::size_t i = 0; i < k.bytes.size(); ++i) {
    const std::uint16_t h =
        kernels::float_to_half(e4m3_value(std::to_integer<std::uint8_t>(k.bytes[i])));
    std::memcpy(&half[2 * i], &h, 2);
  }
  k.dtype = "F16";
  k.bytes = std::move(half);
  const std::string message = refusal(pair.quantized);
  EXPECT_TRUE(contains(message, "model.layers.0.self_attn.k_proj.weight: dtype F16")) << message;
  EXPECT_TRUE(contains(message, "F8_E4M3")) << message;
  EXPECT_TRUE(contains(message, "fp8-block128")) << message;
}

TEST(ModelFp8Refusal, F8WhereNothingIsQuantized) {
  // FP8 projections under a config without quantization_config.
  Pair pair = make_pair(WeightQuant::kFp8Channel, "F32");
  pair.quantized.config.erase("quantization_config");
  std::string message = refusal(pair.quantized);
  EXPECT_TRUE(contains(message, "model.layers.0.self_attn.q_proj.weight: dtype F8_E4M3"))
      << message;
  EXPECT_TRUE(contains(message, "quantization_config")) << message;

  // An embedding in FP8: only the projections are quantized.
  pair = make_pair(WeightQuant::kFp8Block, "F32");
  TensorSpec& embed = pair.quantized.tensor("model.embed_tokens.weight");
  embed.dtype = "F8_E4M3";
  embed.bytes.resize(embed.bytes.size() / 4);
  message = refusal(pair.quantized);
  EXPECT_TRUE(contains(message, "model.embed_tokens.weight: dtype F8_E4M3")) << message;
}

TEST(ModelFp8Refusal, ConfigFieldsKvvmDoesNotImplement) {
  Pair pair = make_pair(WeightQuant::kFp8Block, "F32");
  pair.quantized.config["quantization_config"]["weight_block_size"] = {64, 64};
  std::string message = refusal(pair.quantized);
  EXPECT_TRUE(contains(message, "'quantization_config.weight_block_size' is [64,64]")) << message;

  pair.quantized.config["quantization_config"] = quantization_config(WeightQuant::kFp8Block);
  pair.quantized.config["quantization_config"]["activation_scheme"] = "tensorwise";
  message = refusal(pair.quantized);
  EXPECT_TRUE(contains(message, "'quantization_config.activation_scheme' is \"tensorwise\""))
      << message;

  // Static input scales: compressed-tensors' FP8 (not -dynamic) with its input_scale tensors.
  pair = make_pair(WeightQuant::kFp8Channel, "F32");
  nlohmann::json& inputs =
      pair.quantized.config["quantization_config"]["config_groups"]["group_0"]["input_activations"];
  inputs["dynamic"] = false;
  inputs["strategy"] = "tensor";
  const std::vector<float> one = {0.02f};
  pair.quantized.tensors.push_back(
      {"model.layers.0.self_attn.q_proj.input_scale", "F32", {1}, test::f32_bytes(one)});
  message = refusal(pair.quantized);
  EXPECT_TRUE(contains(message,
                       "'quantization_config.config_groups.group_0.input_activations."
                       "dynamic' is false"))
      << message;
  EXPECT_TRUE(contains(message, "static input scales")) << message;
}

// Weights bound by hand (not through bind_weights) are checked again at load.
TEST(ModelFp8Refusal, HandBoundWeightsAreCheckedAtLoad) {
  test::TempDir dir;
  Result<Fp8Loaded> loaded = load(make_pair(WeightQuant::kFp8Channel, "BF16").quantized, dir / "m");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  model::ModelWeights weights = loaded->weights;
  weights.layers[1].up_weight_scale = nullptr;
  auto made = model::make_cpu_model(loaded->config, weights, {});
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(contains(made.status().message(), "model.layers.1.mlp.up_proj.weight_scale"))
      << made.status().message();

  weights = loaded->weights;
  weights.layers[0].down_weight_scale = weights.layers[0].o_weight_scale;  // [256, 1]: fits
  EXPECT_TRUE(model::make_cpu_model(loaded->config, weights, {}).ok());
  weights.layers[0].down_weight_scale = weights.layers[0].k_weight_scale;  // [128, 1]
  made = model::make_cpu_model(loaded->config, weights, {});
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(contains(made.status().message(), "model.layers.0.mlp.down_proj.weight_scale"))
      << made.status().message();

  weights = loaded->weights;
  weights.layers[0].gate = weights.layers[0].input_norm;
  made = model::make_cpu_model(loaded->config, weights, {});
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(contains(made.status().message(), "model.layers.0.mlp.gate_proj.weight"))
      << made.status().message();
}

// Where the loaders place a quantized projection's float32 scales: in the CUDA backend's layout
// (the projections kept in fp8) after the projections, q's, k's, v's back to back and gate's
// then up's; the CPU backend's layout keeps none (it multiplies them in at load).
TEST(ModelFp8WeightTensors, ScalesSitWhereTheLayoutPutsThem) {
  test::TempDir dir;
  Result<Fp8Loaded> loaded = load(make_pair(WeightQuant::kFp8Block, "F32").quantized, dir / "m");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const model::ModelConfig& c = loaded->config;
  const auto layout = model::detail::weight_layout(c, DType::kBf16);
  ASSERT_EQ(layout.projection, DType::kFp8);
  for (const model::ModelWeights* weights :
       {&loaded->weights, static_cast<model::ModelWeights*>(nullptr)}) {
    auto tensors = model::detail::weight_tensors(c, layout, weights);
    ASSERT_TRUE(tensors.ok()) << tensors.status().to_string();
    std::map<std::string, const model::detail::WeightTensor*> by_name;
    for (const auto& t : *tensors) by_name[t.name] = &t;
    const auto& block = layout.block;
    struct Want {
      const char* name;
      std::uint64_t offset, scales;
    };
    // [256][256] q and o: 2 x 2 blocks; [128][256] k, v: 1 x 2; [320][256] gate, up: 3 x 2;
    // [256][320] down: 2 x 3. The store pads each row of blocks to 4 floats: q's take 32
    // bytes, k's 16, gate's 48.
    const Want wants[] = {{"self_attn.q_proj.weight", block.qkv_scale, 4},
                          {"self_attn.k_proj.weight", block.qkv_scale + 32, 2},
                          {"self_attn.v_proj.weight", block.qkv_scale + 48, 2},
                          {"self_attn.o_proj.weight", block.o_scale, 4},
                          {"mlp.gate_proj.weight", block.gate_up_scale, 6},
                          {"mlp.up_proj.weight", block.gate_up_scale + 48, 6},
                          {"mlp.down_proj.weight", block.down_scale, 6}};
    for (std::uint32_t l = 0; l < c.layers; ++l) {
      for (const Want& want : wants) {
        const std::string name = "model.layers." + std::to_string(l) + "." + want.name;
        const model::detail::WeightTensor& t = *by_name.at(name);
        EXPECT_EQ(t.quant, WeightQuant::kFp8Block) << name;
        EXPECT_EQ(t.scale_offset, want.offset) << name;
        EXPECT_EQ(t.scale_count, want.scales) << name;
        EXPECT_EQ(t.region, l) << name;
        EXPECT_EQ(t.scale_source == nullptr, weights == nullptr) << name;
        if (weights != nullptr) {
          EXPECT_EQ(t.scale_source->name, name.substr(0, name.size() - 7) + ".weight_scale_inv");
        }
      }
    }
    // The up projection's fp8 rows follow the gate's.
    EXPECT_EQ(by_name.at("model.layers.0.mlp.up_proj.weight")->offset, block.gate_up + 320 * 256);
    EXPECT_EQ(by_name.at("model.norm.weight")->quant, WeightQuant::kNone);
    EXPECT_EQ(by_name.at("model.norm.weight")->scale_offset, model::detail::kNoTensor);
  }
  const auto cpu = model::detail::weight_layout(c, DType::kFp32);
  auto tensors = model::detail::weight_tensors(c, cpu, &loaded->weights);
  ASSERT_TRUE(tensors.ok()) << tensors.status().to_string();
  for (const auto& t : *tensors) {
    EXPECT_EQ(t.scale_offset, model::detail::kNoTensor) << t.name;
    if (t.quant != WeightQuant::kNone) {
      EXPECT_GT(t.scale_count, 0u) << t.name;
    }
  }
}

// Per channel, one scale per row, no padding.
TEST(ModelFp8WeightTensors, ChannelScalesFollowOneAnother) {
  test::TempDir dir;
  Result<Fp8Loaded> loaded = load(make_pair(WeightQuant::kFp8Channel, "F32").quantized, dir / "m");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const auto layout = model::detail::weight_layout(loaded->config, DType::kFp16);
  auto tensors = model::detail::weight_tensors(loaded->config, layout, &loaded->weights);
  ASSERT_TRUE(tensors.ok()) << tensors.status().to_string();
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> got;  // offset, count
  for (const auto& t : *tensors) got[t.name] = {t.scale_offset, t.scale_count};
  const auto& block = layout.block;
  const std::string p = "model.layers.1.";
  EXPECT_EQ(got[p + "self_attn.q_proj.weight"], std::make_pair(block.qkv_scale, 256ul));
  EXPECT_EQ(got[p + "self_attn.k_proj.weight"], std::make_pair(block.qkv_scale + 1024, 128ul));
  EXPECT_EQ(got[p + "self_attn.v_proj.weight"], std::make_pair(block.qkv_scale + 1536, 128ul));
  EXPECT_EQ(got[p + "self_attn.o_proj.weight"], std::make_pair(block.o_scale, 256ul));
  EXPECT_EQ(got[p + "mlp.gate_proj.weight"], std::make_pair(block.gate_up_scale, 320ul));
  EXPECT_EQ(got[p + "mlp.up_proj.weight"], std::make_pair(block.gate_up_scale + 1280, 320ul));
  EXPECT_EQ(got[p + "mlp.down_proj.weight"], std::make_pair(block.down_scale, 256ul));
}

// A dummy quantized model draws what the CUDA backend draws: e4m3 values times a scale.
TEST(ModelFp8WeightTensors, DummyQuantizedModelRuns) {
  Result<model::ModelConfig> config = model::parse_model_config(
      make_pair(WeightQuant::kFp8Channel, "F32").quantized.config.dump(), "dummy");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  const std::vector<float> logits =
      last_logits(*config, model::ModelWeights{}, model::LoadFormat::kDummy);
  ASSERT_EQ(logits.size(), config->vocab_size);
  for (float value : logits) EXPECT_TRUE(std::isfinite(value));
}

}  // namespace
}  // namespace kvvm
