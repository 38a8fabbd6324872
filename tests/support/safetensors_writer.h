// Writes safetensors checkpoints and config.json files from a test: well-formed ones (a tiny
// Llama / Qwen2 model with deterministic weights) and, through the raw writer, any broken file
// a loader must refuse. Failures to write throw std::runtime_error (gtest reports them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvvm::test {

struct TensorSpec {
  std::string name;
  std::string dtype;  // the header's spelling ("F32", "BF16", ...); any string, to test refusal
  std::vector<std::uint64_t> shape;
  std::vector<std::byte> bytes;
};

// The header JSON for `tensors` laid out back to back in the order given (data_offsets from 0).
nlohmann::json safetensors_header(const std::vector<TensorSpec>& tensors);

// A well-formed file: the header (with `metadata` as "__metadata__" unless null), padded with
// spaces to a multiple of 8 bytes as the reference writer does, then every tensor's bytes.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorSpec>& tensors,
                       const nlohmann::json& metadata = nullptr);

// Exactly these bytes: an 8-byte little-endian `header_length` (which may lie), `header`,
// then `data`.
void write_safetensors_raw(const std::filesystem::path& path, std::uint64_t header_length,
                           std::string_view header, std::span<const std::byte> data = {});

void write_text_file(const std::filesystem::path& path, std::string_view text);
void write_json_file(const std::filesystem::path& path, const nlohmann::json& json);

// Element encodings (bf16 rounds to nearest even; f16 is not needed yet).
std::vector<std::byte> f32_bytes(std::span<const float> values);
std::vector<std::byte> bf16_bytes(std::span<const float> values);
// `count` floats in [-scale, scale], the same for the same seed.
std::vector<float> random_floats(std::size_t count, std::uint64_t seed, float scale = 0.1f);

// A small model's numbers: the config.json and the tensors a checkpoint of it holds.
struct TinyModel {
  // or Qwen2ForCausalLM, Qwen3ForCausalLM (q/k norms written), MistralForCausalLM
  std::string architecture = "LlamaForCausalLM";
  std::uint32_t hidden = 64;
  std::uint32_t intermediate = 128;
  std::uint32_t layers = 2;
  std::uint32_t heads = 4;
  std::uint32_t kv_heads = 2;
  std::uint32_t head_dim = 16;
  std::uint32_t vocab = 96;
  bool attention_bias = false;  // Llama / Mistral: q, k, v and o biases; Qwen2 has q/k/v always
  bool tied = false;            // tie_word_embeddings: no lm_head.weight written
  std::string dtype = "F32";    // "F32" or "BF16" for every tensor
  std::uint64_t seed = 1;       // the weights' values
};

// config.json text fields for `model` (torch_dtype from dtype, rope_theta 10000, eps 1e-5).
nlohmann::json tiny_config_json(const TinyModel& model);
// Every tensor weights.h lists, in that order, with seeded values (norm weights near 1).
std::vector<TensorSpec> tiny_model_tensors(const TinyModel& model);
// DIR/config.json and DIR/model.safetensors for `model`; creates DIR.
void write_tiny_model(const std::filesystem::path& dir, const TinyModel& model);

// The same as `shards` files, model-0000i-of-0000n.safetensors, holding the tensors in order
// (runs of nearly equal counts; `extra` added to the last), and the index naming them.
void write_tiny_model_shards(const std::filesystem::path& dir, const TinyModel& model,
                             std::uint32_t shards, const std::vector<TensorSpec>& extra = {});

// A fresh directory under the system's temp directory, removed with everything in it.
class TempDir {
 public:
  TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace kvvm::test
