// A checkpoint's load reports its progress through WeightOptions::on_progress (the library
// prints nothing): a tiny model written as three shards, an unused tensor beside them, loaded
// on the CPU with a callback that keeps every call.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kvvm/model/model.h"
#include "kvvm/model/weights.h"
#include "support/safetensors_writer.h"

namespace kvvm::model {
namespace {

using test::TempDir;
using test::TensorSpec;
using test::TinyModel;

// The tiny model as three shards, a rotary buffer the model does not read in the last one.
// Returns the bytes of the tensors the model reads.
std::uint64_t write_three_shards(const TempDir& dir, const TinyModel& model) {
  const std::vector<float> unused(8, 1.0f);
  test::write_tiny_model_shards(
      dir.path(), model, 3,
      {TensorSpec{
          "model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {8}, test::f32_bytes(unused)}});
  std::uint64_t read = 0;
  for (const TensorSpec& spec : test::tiny_model_tensors(model)) read += spec.bytes.size();
  return read;
}

struct ProgressLoaded {
  std::unique_ptr<WeightFiles> files;
  ModelConfig config;
  ModelWeights weights;
};

ProgressLoaded open(const TempDir& dir) {
  ProgressLoaded loaded;
  Result<ModelConfig> config = load_model_config(dir.path().string());
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  loaded.config = *config;
  Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_dir(dir.path().string());
  EXPECT_TRUE(files.ok()) << files.status().to_string();
  loaded.files = std::move(files).value();
  Result<ModelWeights> weights = bind_weights(loaded.config, *loaded.files);
  EXPECT_TRUE(weights.ok()) << weights.status().to_string();
  loaded.weights = *weights;
  return loaded;
}

TEST(ModelLoadProgress, ShardsAreCountedAndTheBytesGrowToTheTotal) {
  TinyModel model;
  TempDir dir;
  const std::uint64_t total = write_three_shards(dir, model);
  ProgressLoaded loaded = open(dir);
  std::vector<LoadProgress> calls;
  CpuModelOptions options;
  options.weights.on_progress = [&calls](const LoadProgress& p) { calls.push_back(p); };
  Result<std::unique_ptr<Model>> made = make_cpu_model(loaded.config, loaded.weights, options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();

  // One call per tensor read at least; the bytes never go back and end at the total.
  ASSERT_GE(calls.size(), test::tiny_model_tensors(model).size());
  std::uint64_t bytes = 0;
  std::uint32_t done = 0;
  double seconds = 0;
  std::vector<std::uint32_t> finished;
  for (const LoadProgress& p : calls) {
    EXPECT_EQ(p.shards, 3u);
    EXPECT_EQ(p.total_bytes, total) << "the unused tensor is not counted";
    EXPECT_GE(p.bytes, bytes);
    EXPECT_LE(p.bytes, p.total_bytes);
    EXPECT_GE(p.shards_done, done);
    EXPECT_GE(p.seconds, seconds);
    if (p.shard_done) {
      EXPECT_EQ(p.shards_done, done + 1);
      finished.push_back(p.shards_done);
    }
    bytes = p.bytes;
    done = p.shards_done;
    seconds = p.seconds;
  }
  EXPECT_EQ(finished, (std::vector<std::uint32_t>{1, 2, 3}));
  EXPECT_EQ(calls.back().bytes, total);
  EXPECT_EQ(calls.back().shards_done, 3u);
  EXPECT_TRUE(calls.back().shard_done);
}

TEST(ModelLoadProgress, OneFileIsOneShardAndDummyWeightsReportNothing) {
  TinyModel model;
  TempDir dir;
  test::write_tiny_model(dir.path(), model);
  ProgressLoaded loaded = open(dir);
  std::vector<LoadProgress> calls;
  CpuModelOptions options;
  options.weights.on_progress = [&calls](const LoadProgress& p) { calls.push_back(p); };
  ASSERT_TRUE(make_cpu_model(loaded.config, loaded.weights, options).ok());
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back().shards, 1u);
  EXPECT_EQ(calls.back().shards_done, 1u);
  EXPECT_EQ(calls.back().bytes, (*loaded.files).total_bytes());

  calls.clear();
  options.weights.format = LoadFormat::kDummy;
  ASSERT_TRUE(make_cpu_model(loaded.config, ModelWeights{}, options).ok());
  EXPECT_TRUE(calls.empty()) << "no file is read";
}

}  // namespace
}  // namespace kvvm::model
