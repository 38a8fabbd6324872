#include "support/safetensors_writer.h"

#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <system_error>

namespace kvvm::test {
namespace {

void write_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  if (!file) throw std::runtime_error("cannot write '" + path.string() + "'");
}

void append(std::vector<std::byte>& out, std::string_view text) {
  for (char c : text) out.push_back(static_cast<std::byte>(c));
}

}  // namespace

nlohmann::json safetensors_header(const std::vector<TensorSpec>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const TensorSpec& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  return header;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorSpec>& tensors,
                       const nlohmann::json& metadata) {
  nlohmann::json header = safetensors_header(tensors);
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::vector<std::byte> data;
  for (const TensorSpec& tensor : tensors) {
    data.insert(data.end(), tensor.bytes.begin(), tensor.bytes.end());
  }
  write_safetensors_raw(path, text.size(), text, data);
}

void write_safetensors_raw(const std::filesystem::path& path, std::uint64_t header_length,
                           std::string_view header, std::span<const std::byte> data) {
  std::vector<std::byte> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<std::byte>(header_length >> (8 * i)));
  append(bytes, header);
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_bytes(path, bytes);
}

void write_text_file(const std::filesystem::path& path, std::string_view text) {
  std::vector<std::byte> bytes;
  append(bytes, text);
  write_bytes(path, bytes);
}

void write_json_file(const std::filesystem::path& path, const nlohmann::json& json) {
  write_text_file(path, json.dump(2));
}

std::vector<std::byte> f32_bytes(std::span<const float> values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());  // the host is little-endian
  return bytes;
}

std::vector<std::byte> bf16_bytes(std::span<const float> values) {
  std::vector<std::byte> bytes;
  bytes.reserve(values.size() * 2);
  for (float value : values) {
    std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
    bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest even (finite inputs only)
    bytes.push_back(static_cast<std::byte>(bits >> 16));
    bytes.push_back(static_cast<std::byte>(bits >> 24));
  }
  return bytes;
}

std::vector<float> random_floats(std::size_t count, std::uint64_t seed, float scale) {
  std::mt19937_64 random(seed * 0x9E3779B97F4A7C15ull + 7);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(random);
  return values;
}

nlohmann::json tiny_config_json(const TinyModel& model) {
  const bool qwen = model.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = model.architecture == "Qwen3ForCausalLM";
  const bool mistral = model.architecture == "MistralForCausalLM";
  nlohmann::json config = {
      {"architectures", {model.architecture}},
      {"model_type", qwen ? "qwen2" : (qwen3 ? "qwen3" : (mistral ? "mistral" : "llama"))},
      {"hidden_size", model.hidden},
      {"intermediate_size", model.intermediate},
      {"num_hidden_layers", model.layers},
      {"num_attention_heads", model.heads},
      {"num_key_value_heads", model.kv_heads},
      {"head_dim", model.head_dim},
      {"vocab_size", model.vocab},
      {"max_position_embeddings", 256},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", model.tied},
      {"torch_dtype", model.dtype == "BF16" ? "bfloat16" : "float32"},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  };
  if (!qwen) config["attention_bias"] = model.attention_bias;
  return config;
}

std::vector<TensorSpec> tiny_model_tensors(const TinyModel& model) {
  std::vector<TensorSpec> tensors;
  std::uint64_t seed = model.seed * 1000;
  const auto add = [&](const std::string& name, std::vector<std::uint64_t> shape,
                       bool norm = false) {
    std::uint64_t count = 1;
    for (std::uint64_t d : shape) count *= d;
    std::vector<float> values = random_floats(count, ++seed);
    if (norm) {
      for (float& value : values) value += 1.0f;
    }
    tensors.push_back({name, model.dtype, std::move(shape),
                       model.dtype == "BF16" ? bf16_bytes(values) : f32_bytes(values)});
  };
  const std::uint64_t hidden = model.hidden;
  const std::uint64_t q_rows = std::uint64_t{model.heads} * model.head_dim;
  const std::uint64_t kv_rows = std::uint64_t{model.kv_heads} * model.head_dim;
  const bool qwen = model.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = model.architecture == "Qwen3ForCausalLM";
  add("model.embed_tokens.weight", {model.vocab, hidden});
  for (std::uint32_t i = 0; i < model.layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    add(prefix + "input_layernorm.weight", {hidden}, true);
    add(prefix + "self_attn.q_proj.weight", {q_rows, hidden});
    add(prefix + "self_attn.k_proj.weight", {kv_rows, hidden});
    add(prefix + "self_attn.v_proj.weight", {kv_rows, hidden});
    if (qwen || model.attention_bias) {
      add(prefix + "self_attn.q_proj.bias", {q_rows});
      add(prefix + "self_attn.k_proj.bias", {kv_rows});
      add(prefix + "self_attn.v_proj.bias", {kv_rows});
    }
    add(prefix + "self_attn.o_proj.weight", {hidden, q_rows});
    if (!qwen && model.attention_bias) add(prefix + "self_attn.o_proj.bias", {hidden});
    if (qwen3) {
      add(prefix + "self_attn.q_norm.weight", {model.head_dim}, true);
      add(prefix + "self_attn.k_norm.weight", {model.head_dim}, true);
    }
    add(prefix + "post_attention_layernorm.weight", {hidden}, true);
    add(prefix + "mlp.gate_proj.weight", {model.intermediate, hidden});
    add(prefix + "mlp.up_proj.weight", {model.intermediate, hidden});
    add(prefix + "mlp.down_proj.weight", {hidden, model.intermediate});
  }
  add("model.norm.weight", {hidden}, true);
  if (!model.tied) add("lm_head.weight", {model.vocab, hidden});
  return tensors;
}

void write_tiny_model(const std::filesystem::path& dir, const TinyModel& model) {
  std::filesystem::create_directories(dir);
  write_json_file(dir / "config.json", tiny_config_json(model));
  write_safetensors(dir / "model.safetensors", tiny_model_tensors(model),
                    nlohmann::json{{"format", "pt"}});
}

void write_tiny_model_shards(const std::filesystem::path& dir, const TinyModel& model,
                             std::uint32_t shards, const std::vector<TensorSpec>& extra) {
  if (shards == 0) throw std::runtime_error("write_tiny_model_shards: no shards");
  std::filesystem::create_directories(dir);
  write_json_file(dir / "config.json", tiny_config_json(model));
  const std::vector<TensorSpec> tensors = tiny_model_tensors(model);
  std::vector<std::vector<TensorSpec>> files(shards);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    files[i * shards / tensors.size()].push_back(tensors[i]);
  }
  files.back().insert(files.back().end(), extra.begin(), extra.end());
  nlohmann::json weight_map = nlohmann::json::object();
  for (std::uint32_t s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", s + 1, shards);
    write_safetensors(dir / name, files[s], nlohmann::json{{"format", "pt"}});
    for (const TensorSpec& spec : files[s]) weight_map[spec.name] = name;
  }
  write_json_file(dir / "model.safetensors.index.json", {{"weight_map", weight_map}});
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  path_ = std::filesystem::temp_directory_path() /
          ("kvvm_model_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace kvvm::test
