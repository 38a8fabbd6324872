// The KV geometry the model layer derives from a ModelConfig: the built-in models, and the KV
// shape of a Hugging Face config.json (load_kv_config), with an error that names every missing
// or malformed field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kvvm/model/kv_config.h"
#include "support/test_data.h"
#include "support/text_match.h"

namespace kvvm::model {
namespace {

namespace fs = std::filesystem;

using test::data_dir;

// A directory of its own per test, removed afterwards.
class ConfigDir {
 public:
  ConfigDir() {
    static std::atomic<int> counter{0};
    path_ =
        fs::temp_directory_path() / ("kvvm_model_config_geometry_test_" + std::to_string(getpid()) +
                                     "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ConfigDir(const ConfigDir&) = delete;
  ConfigDir& operator=(const ConfigDir&) = delete;
  ~ConfigDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

  std::string write(const std::string& name, const std::string& text) const {
    const fs::path file = path_ / name;
    std::ofstream(file) << text;
    return file.string();
  }

 private:
  fs::path path_;
};

nlohmann::json qwen_config() {
  std::ifstream file(data_dir() / "config_qwen2.5-0.5b.json");
  return nlohmann::json::parse(file);
}

using test::contains;

// The KV shape of the config.json at `path`, as kvvm plan reads it.
Result<Geometry> geometry_from_config_json(const std::string& path,
                                           std::optional<DType> dtype = std::nullopt) {
  Result<ModelConfig> config = load_kv_config(path, dtype.has_value());
  if (!config.ok()) return config.status();
  return kv_geometry(*config, dtype);
}

TEST(ModelConfigGeometry, BuiltinModelsHaveThePublishedShapes) {
  struct Expected {
    const char* name;
    std::uint32_t layers, kv_heads, head_dim;
    std::uint64_t bytes_per_token;  // L * 2 * H * D * 2 at fp16
  };
  const Expected expected[] = {
      {"qwen2.5-0.5b", 24, 2, 64, 12'288},
      {"llama-3-8b", 32, 8, 128, 131'072},
      {"qwen2.5-7b", 28, 4, 128, 57'344},
      {"qwen2.5-14b", 48, 8, 128, 196'608},
      {"llama-3-70b", 80, 8, 128, 327'680},
      {"qwen3-0.6b", 28, 8, 128, 114'688},
      {"qwen3-8b", 36, 8, 128, 147'456},
      // The mixtures: their attention's KV, whatever the experts.
      {"qwen3-30b-a3b", 48, 4, 128, 98'304},
      {"mixtral-8x7b", 32, 8, 128, 131'072},
      {"qwen2-57b-a14b", 28, 4, 128, 57'344},
  };
  std::vector<std::string> names;
  for (const Expected& model : expected) {
    names.emplace_back(model.name);
    Result<Geometry> geometry = builtin_geometry(model.name);
    ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
    EXPECT_EQ(geometry->name, model.name);
    EXPECT_EQ(geometry->layers, model.layers) << model.name;
    EXPECT_EQ(geometry->kv_heads, model.kv_heads) << model.name;
    EXPECT_EQ(geometry->head_dim, model.head_dim) << model.name;
    EXPECT_EQ(geometry->dtype, DType::kFp16) << "fp16 unless told otherwise";
    EXPECT_EQ(geometry->element_bytes(), 2u);
    EXPECT_EQ(geometry->bytes_per_token(), model.bytes_per_token) << model.name;
  }
  EXPECT_EQ(builtin_model_names(), names);
}

TEST(ModelConfigGeometry, ReferenceWorkedNumberQwen14bIs196608BytesPerToken) {
  Result<Geometry> geometry = builtin_geometry("qwen2.5-14b");
  ASSERT_TRUE(geometry.ok());
  EXPECT_EQ(geometry->bytes_per_token(), 196'608u);
}

TEST(ModelConfigGeometry, BuiltinNamesIgnoreCase) {
  Result<Geometry> geometry = builtin_geometry("Qwen2.5-14B");
  ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
  EXPECT_EQ(geometry->name, "qwen2.5-14b");
}

TEST(ModelConfigGeometry, UnknownModelListsTheKnownNames) {
  Result<Geometry> geometry = builtin_geometry("gpt-5");
  ASSERT_FALSE(geometry.ok());
  EXPECT_EQ(geometry.status().code(), StatusCode::kInvalidArgument);
  const std::string message = geometry.status().message();
  EXPECT_TRUE(contains(message, "'gpt-5'")) << message;
  for (const std::string& name : builtin_model_names()) {
    EXPECT_TRUE(contains(message, name)) << name << " missing from: " << message;
  }
  EXPECT_TRUE(contains(message, "config.json")) << message;
}

TEST(ModelConfigGeometry, ReadsAQwenConfigDerivingHeadDim) {
  const std::string path = (data_dir() / "config_qwen2.5-0.5b.json").string();
  Result<Geometry> geometry = geometry_from_config_json(path);
  ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
  EXPECT_EQ(geometry->layers, 24u);
  EXPECT_EQ(geometry->kv_heads, 2u);
  EXPECT_EQ(geometry->head_dim, 64u) << "hidden_size 896 / num_attention_heads 14";
  EXPECT_EQ(geometry->dtype, DType::kBf16) << "from torch_dtype";
  EXPECT_EQ(geometry->bytes_per_token(), builtin_geometry("qwen2.5-0.5b")->bytes_per_token());
  EXPECT_EQ(geometry->name, path);

  Result<Geometry> overridden = geometry_from_config_json(path, DType::kFp8);
  ASSERT_TRUE(overridden.ok());
  EXPECT_EQ(overridden->dtype, DType::kFp8);
}

TEST(ModelConfigGeometry, ExplicitHeadDimWinsOverHiddenSizeOverHeads) {
  Result<Geometry> geometry =
      geometry_from_config_json((data_dir() / "config_explicit_head_dim.json").string());
  ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
  EXPECT_EQ(geometry->layers, 28u);
  EXPECT_EQ(geometry->kv_heads, 8u);
  EXPECT_EQ(geometry->head_dim, 128u) << "not 1024 / 16 = 64";
  EXPECT_EQ(geometry->dtype, DType::kBf16) << "from 'dtype', the newer spelling";
}

TEST(ModelConfigGeometry, WithoutKvHeadsEveryAttentionHeadHasItsOwn) {
  Result<Geometry> geometry =
      geometry_from_config_json((data_dir() / "config_no_gqa.json").string());
  ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
  EXPECT_EQ(geometry->kv_heads, 32u);
  EXPECT_EQ(geometry->head_dim, 128u) << "head_dim null counts as absent: 4096 / 32";
  EXPECT_EQ(geometry->dtype, DType::kFp16);
}

TEST(ModelConfigGeometry, VisionLanguageConfigsAreReadFromTextConfig) {
  Result<Geometry> geometry =
      geometry_from_config_json((data_dir() / "config_text_config.json").string());
  ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
  EXPECT_EQ(geometry->layers, 34u);
  EXPECT_EQ(geometry->kv_heads, 4u);
  EXPECT_EQ(geometry->head_dim, 256u);
  EXPECT_EQ(geometry->dtype, DType::kBf16);
}

TEST(ModelConfigGeometry, EachMissingFieldIsNamed) {
  ConfigDir dir;
  struct Case {
    std::vector<std::string> removed;
    std::vector<std::string> named;  // in the message
  };
  const std::vector<Case> cases = {
      {{"num_hidden_layers"}, {"'num_hidden_layers'"}},
      {{"num_key_value_heads", "num_attention_heads"},
       {"'num_key_value_heads'", "'num_attention_heads'"}},
      {{"hidden_size"}, {"'head_dim'", "'hidden_size'"}},
      {{"torch_dtype"}, {"'torch_dtype'", "--kv-dtype"}},
      // Everything at once: one message names all four.
      {{"num_hidden_layers", "num_key_value_heads", "num_attention_heads", "torch_dtype"},
       {"'num_hidden_layers'", "'num_key_value_heads'", "'head_dim'", "'torch_dtype'"}},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    nlohmann::json config = qwen_config();
    for (const std::string& field : cases[i].removed) config.erase(field);
    const std::string path = dir.write("config" + std::to_string(i) + ".json", config.dump());
    Result<Geometry> geometry = geometry_from_config_json(path);
    ASSERT_FALSE(geometry.ok()) << "case " << i;
    EXPECT_EQ(geometry.status().code(), StatusCode::kInvalidArgument);
    const std::string message = geometry.status().message();
    EXPECT_TRUE(contains(message, path)) << message;
    EXPECT_TRUE(contains(message, "missing")) << message;
    for (const std::string& field : cases[i].named) {
      EXPECT_TRUE(contains(message, field)) << field << " not named in: " << message;
    }
  }
  // Only num_key_value_heads missing is not an error: num_attention_heads stands in.
  nlohmann::json config = qwen_config();
  config.erase("num_key_value_heads");
  Result<Geometry> mha = geometry_from_config_json(dir.write("mha.json", config.dump()));
  ASSERT_TRUE(mha.ok()) << mha.status().to_string();
  EXPECT_EQ(mha->kv_heads, 14u);
  // A missing torch_dtype is fine when the caller gives one.
  config = qwen_config();
  config.erase("torch_dtype");
  EXPECT_TRUE(
      geometry_from_config_json(dir.write("nodtype.json", config.dump()), DType::kFp16).ok());
}

TEST(ModelConfigGeometry, MalformedFieldsAreNamedWithTheirValue) {
  ConfigDir dir;
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"num_hidden_layers", 0},      {"num_hidden_layers", -24}, {"num_hidden_layers", 2.5},
      {"num_hidden_layers", "24"},   {"num_key_value_heads", 0}, {"head_dim", -1},
      {"hidden_size", 5000000000LL}, {"torch_dtype", "int4"},    {"torch_dtype", 16},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& [field, value] = cases[i];
    nlohmann::json config = qwen_config();
    config[field] = value;
    if (field == "hidden_size") config.erase("head_dim");
    Result<Geometry> geometry =
        geometry_from_config_json(dir.write("bad" + std::to_string(i) + ".json", config.dump()));
    ASSERT_FALSE(geometry.ok()) << field << " = " << value.dump();
    EXPECT_EQ(geometry.status().code(), StatusCode::kInvalidArgument);
    const std::string message = geometry.status().message();
    EXPECT_TRUE(contains(message, "'" + field + "'")) << message;
    const std::string shown = value.is_string() ? value.get<std::string>() : value.dump();
    EXPECT_TRUE(contains(message, shown)) << message;
  }
  nlohmann::json config = qwen_config();
  config["hidden_size"] = 900;  // not a multiple of 14 heads
  Result<Geometry> indivisible =
      geometry_from_config_json(dir.write("indivisible.json", config.dump()));
  ASSERT_FALSE(indivisible.ok());
  EXPECT_TRUE(contains(indivisible.status().message(), "900")) << indivisible.status().message();
}

TEST(ModelConfigGeometry, KvHeadsMustDivideTheQueryHeads) {
  ConfigDir dir;
  nlohmann::json config = qwen_config();  // 14 query heads
  config["num_key_value_heads"] = 4;
  Result<Geometry> indivisible = geometry_from_config_json(dir.write("four.json", config.dump()));
  ASSERT_FALSE(indivisible.ok());
  EXPECT_EQ(indivisible.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(indivisible.status().message(),
                       "'num_attention_heads' 14 is not a multiple of 'num_key_value_heads' 4"))
      << indivisible.status().message();
  config["num_key_value_heads"] = 28;
  Result<Geometry> more = geometry_from_config_json(dir.write("more.json", config.dump()));
  ASSERT_FALSE(more.ok());
  EXPECT_TRUE(contains(more.status().message(),
                       "'num_key_value_heads' 28 is more than 'num_attention_heads' 14"))
      << more.status().message();
  config["num_key_value_heads"] = 7;  // two query heads per KV head
  Result<Geometry> grouped = geometry_from_config_json(dir.write("seven.json", config.dump()));
  ASSERT_TRUE(grouped.ok()) << grouped.status().to_string();
  EXPECT_EQ(grouped->kv_heads, 7u);
}

TEST(ModelConfigGeometry, AbsurdSizesAreRefusedWithTheBound) {
  ConfigDir dir;
  const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases = {
      {"num_hidden_layers", 5000, "[1, 1024]"},
      {"num_hidden_layers", 24.0, "[1, 1024]"},
      {"num_attention_heads", 1000000, "[1, 4096]"},
      {"num_key_value_heads", 100000, "[1, 4096]"},
      {"head_dim", 65536, "[1, 4096]"},
      {"hidden_size", 2000000, "[1, 1048576]"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& [field, value, bound] = cases[i];
    nlohmann::json config = qwen_config();
    config[field] = value;
    if (field == "hidden_size") config.erase("head_dim");
    Result<Geometry> geometry =
        geometry_from_config_json(dir.write("big" + std::to_string(i) + ".json", config.dump()));
    ASSERT_FALSE(geometry.ok()) << field << " = " << value.dump();
    const std::string message = geometry.status().message();
    EXPECT_TRUE(contains(message, "'" + field + "' is " + value.dump())) << message;
    EXPECT_TRUE(contains(message, bound)) << message;
  }
  // A head size derived from hidden_size / num_attention_heads is bounded too.
  nlohmann::json config = qwen_config();
  config.erase("head_dim");
  config["hidden_size"] = 1 << 20;
  config["num_attention_heads"] = 16;
  config["num_key_value_heads"] = 2;
  Result<Geometry> derived = geometry_from_config_json(dir.write("derived.json", config.dump()));
  ASSERT_FALSE(derived.ok());
  EXPECT_TRUE(contains(derived.status().message(), "65536 is over the head size bound of 4096"))
      << derived.status().message();
}

TEST(ModelConfigGeometry, HostileFilesAreRefusedNotCrashedOn) {
  ConfigDir dir;
  const std::string deep =
      dir.write("deep.json", "{\"num_hidden_layers\": " + std::string(100000, '[') +
                                 std::string(100000, ']') + "}");
  Result<Geometry> nested = geometry_from_config_json(deep);
  ASSERT_FALSE(nested.ok());
  EXPECT_TRUE(contains(nested.status().message(), deep)) << nested.status().message();
  EXPECT_TRUE(contains(nested.status().message(), "nested deeper than the limit of 64 levels"))
      << nested.status().message();
  const std::string latin1 = dir.write("latin1.json", "{\"name\": \"caf\xe9\"}");
  Result<Geometry> bad_utf8 = geometry_from_config_json(latin1);
  ASSERT_FALSE(bad_utf8.ok());
  EXPECT_TRUE(contains(bad_utf8.status().message(), "invalid UTF-8 at byte 13"))
      << bad_utf8.status().message();
  const std::string huge = dir.write("huge.json", std::string((16 << 20) + 1, ' '));
  Result<Geometry> too_big = geometry_from_config_json(huge);
  ASSERT_FALSE(too_big.ok());
  EXPECT_TRUE(contains(too_big.status().message(), "over the limit of 16777216 bytes"))
      << too_big.status().message();
}

TEST(ModelConfigGeometry, UnreadableFilesSayWhatAndWhere) {
  ConfigDir dir;
  const std::string absent = (dir.path() / "absent.json").string();
  Result<Geometry> missing = geometry_from_config_json(absent);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(missing.status().message(), absent)) << missing.status().message();

  Result<Geometry> garbage = geometry_from_config_json(dir.write("garbage.json", "{ not json"));
  ASSERT_FALSE(garbage.ok());
  EXPECT_TRUE(contains(garbage.status().message(), "not valid JSON"));

  Result<Geometry> array = geometry_from_config_json(dir.write("array.json", "[1, 2]"));
  ASSERT_FALSE(array.ok());
  EXPECT_TRUE(contains(array.status().message(), "not a JSON object"));
}

TEST(ModelConfigGeometry, BuiltinConfigsAreWholeModelConfigs) {
  // The table holds ModelConfigs, not bare shapes: the query heads and hidden size agree with
  // the head size the geometry uses.
  for (const std::string& name : builtin_model_names()) {
    Result<ModelConfig> config = builtin_model_config(name);
    ASSERT_TRUE(config.ok()) << name;
    EXPECT_EQ(config->name, name);
    EXPECT_EQ(config->heads % config->kv_heads, 0u) << name;
    // Qwen3 gives its head size apart from hidden / heads (the 0.6B's 16 heads of 128 over 1024).
    if (config->architecture == "Qwen3ForCausalLM" ||
        config->architecture == "Qwen3MoeForCausalLM") {
      EXPECT_EQ(config->head_dim, 128u) << name;
      EXPECT_TRUE(config->qk_norm) << name;
    } else {
      EXPECT_EQ(config->hidden_size, config->heads * config->head_dim) << name;
      EXPECT_FALSE(config->qk_norm) << name;
    }
    EXPECT_EQ(kv_geometry(*config, DType::kFp16).bytes_per_token(),
              builtin_geometry(name)->bytes_per_token())
        << name;
  }
}

TEST(ModelConfigGeometry, KvShapeNeedsNoArchitectureTheRuntimeRuns) {
  ConfigDir dir;
  nlohmann::json config = qwen_config();
  config["architectures"] = {"GemmaForCausalLM"};
  config["model_type"] = "gemma";
  const std::string path = dir.write("gemma.json", config.dump());
  Result<Geometry> geometry = geometry_from_config_json(path);
  ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
  EXPECT_EQ(geometry->layers, 24u);
  // The same file is refused for running: the one parser checks more there.
  std::ifstream file(path);
  const std::string text(std::istreambuf_iterator<char>(file), {});
  Result<ModelConfig> run = parse_model_config(text, path);
  ASSERT_FALSE(run.ok());
  EXPECT_TRUE(contains(run.status().message(), "GemmaForCausalLM")) << run.status().message();
}

}  // namespace
}  // namespace kvvm::model
