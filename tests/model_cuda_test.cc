// The CUDA model (make_cuda_model) against the float64 reference of tests/support on tiny
// random models with fresh weights each run: Qwen2-like (q/k/v biases, tied embeddings) in
// bf16 and fp16, and Llama-like (o bias, untied lm_head, llama3 RoPE scaling, three layers,
// an F32 checkpoint converted to bf16), head dim 64 with grouped-query attention. The KV
// lives in a CUDA-driver arena with only each sequence's windows committed. Checked: the last
// logits of every chunk of a chunked prefill followed by decodes, and of a packed batch of two
// sequences mixing prefill chunks and decodes in one step, within 2e-2 relative; the greedy
// token equal to the reference's wherever its top-2 margin exceeds the tolerance (scaled by
// the logits' size); and refusals of malformed batches that leave the model usable. Skipped
// without a GPU; what a build without one answers is checked everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvvm/cuda_driver.h"
#include "kvvm/model/model.h"
#include "support/attention_support.h"
#include "support/cuda_model_reference.h"
#include "support/pattern.h"

namespace kvvm::model {
namespace {

using testing::TinyModelSpec;

constexpr double kTolerance = 2e-2;

TEST(CudaModelAvailability, WithoutADeviceOrKernelsTheModelIsUnavailable) {
  const auto tiny = testing::make_tiny_model(TinyModelSpec{}, 1);
  auto made = make_cuda_model(tiny->config, tiny->weights, CudaModelOptions{});
#if defined(KVVM_HAS_CUDA_KERNELS)
  if (cuda_available()) {
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return;
  }
#endif
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kUnavailable) << made.status().to_string();
}

#if defined(KVVM_HAS_CUDA_KERNELS)
TEST(CudaModelAvailability, AHeadDimTheKernelsLackIsRefusedByName) {
  TinyModelSpec spec;
  spec.head_dim = 96;
  const auto tiny = testing::make_tiny_model(spec, 1);
  auto made = make_cuda_model(tiny->config, tiny->weights, CudaModelOptions{});
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument) << made.status().to_string();
  EXPECT_NE(made.status().message().find("head dim 96"), std::string::npos);
}

struct Case {
  std::string name;
  TinyModelSpec spec;
  DType compute;  // what the options ask for
  DType kv;       // the compute type it runs in (and the KV's)
};

std::vector<Case> cases() {
  TinyModelSpec qwen;
  qwen.rope.theta = 1000000.0;
  TinyModelSpec llama;
  llama.architecture = "LlamaForCausalLM";
  llama.hidden = 192;
  llama.intermediate = 320;
  llama.layers = 3;
  llama.heads = 6;
  llama.kv_heads = 2;
  llama.vocab = 257;
  llama.qkv_bias = false;
  llama.o_bias = true;
  llama.tied = false;
  llama.rope.theta = 500000.0;
  llama.rope.scaling = RopeScaling::kLlama3;
  llama.rope.factor = 8.0;
  llama.rope.low_freq_factor = 1.0;
  llama.rope.high_freq_factor = 4.0;
  llama.rope.original_max_position = 64;
  llama.dtype = TensorDType::kF32;
  return {{"qwen2_bf16", qwen, DType::kUnset, DType::kBf16},
          {"qwen2_fp16", qwen, DType::kFp16, DType::kFp16},
          {"llama3_f32_as_bf16", llama, DType::kUnset, DType::kBf16}};
}

class CudaModelTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    auto driver = make_cuda_driver();
    if (!driver.ok()) GTEST_SKIP() << "no CUDA device: " << driver.status().to_string();
    driver_ = std::move(driver).value();
    seed_ = testing::fresh_seed();
    random_.seed(seed_);
    RecordProperty("seed", std::to_string(seed_));
    tiny_ = testing::make_tiny_model(GetParam().spec, seed_);
    CudaModelOptions options;
    options.limits.max_step_tokens = 64;
    options.limits.max_chunks = 4;
    options.compute = GetParam().compute;
    auto made = make_cuda_model(tiny_->config, tiny_->weights, options);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    model_ = std::move(made).value();
    EXPECT_EQ(model_->backend(), Backend::kCuda);
    kv_ = testing::KvArena::make(*driver_, tiny_->config.kv_geometry(GetParam().kv),
                                 Layout::kTokenMajor, GetParam().spec.max_positions, 4);
    ASSERT_TRUE(kv_);
  }

  std::vector<std::int32_t> random_ids(std::size_t count) {
    std::vector<std::int32_t> ids(count);
    for (auto& id : ids) id = static_cast<std::int32_t>(random_() % tiny_->config.vocab_size);
    return ids;
  }

  // A sequence of `length` random tokens in a slot committed through its end.
  struct Sequence {
    std::vector<std::int32_t> ids;
    SlotId slot = 0;
    std::vector<std::vector<double>> reference;  // logits of every position
  };
  Sequence sequence(std::size_t length) {
    Sequence s;
    s.ids = random_ids(length);
    auto slot = kv_->arena->admit(length);
    EXPECT_TRUE(slot.ok()) << slot.status().to_string();
    s.slot = slot.ok() ? *slot : 0;
    s.reference = testing::reference_logits(tiny_->config, tiny_->weights, s.ids);
    return s;
  }

  // One step over (sequence, start, tokens) pieces; each chunk's last logits and greedy token
  // checked against its sequence's reference.
  struct Piece {
    const Sequence* sequence;
    std::uint32_t start;
    std::uint32_t tokens;
  };
  void step(const std::vector<Piece>& pieces, const std::string& what) {
    std::vector<Chunk> chunks;
    std::vector<std::int32_t> ids;
    for (const Piece& piece : pieces) {
      chunks.push_back({piece.sequence->slot, piece.start, piece.tokens});
      ids.insert(ids.end(), piece.sequence->ids.begin() + piece.start,
                 piece.sequence->ids.begin() + piece.start + piece.tokens);
    }
    const std::uint32_t vocab = tiny_->config.vocab_size;
    std::vector<float> logits(pieces.size() * vocab, NAN);
    std::vector<std::int32_t> argmax(pieces.size(), -1);
    StepBatch batch{ids, chunks, kv_->arena->view()};
    Status done = model_->forward(batch, StepOutput{logits.data(), argmax.data()});
    ASSERT_TRUE(done.ok()) << what << ": " << done.to_string();
    for (std::size_t c = 0; c < pieces.size(); ++c) {
      const Piece& piece = pieces[c];
      const std::uint32_t position = piece.start + piece.tokens - 1;
      const std::vector<double>& want = piece.sequence->reference[position];
      const std::span<const float> got(&logits[c * vocab], vocab);
      const std::string where =
          what + ", chunk " + std::to_string(c) + " [" + std::to_string(piece.start) + ", " +
          std::to_string(piece.start + piece.tokens) + "), seed " + std::to_string(seed_);
      const double error = testing::logits_relative_error(got, want);
      EXPECT_LT(error, kTolerance) << where;
      // The argmax kernel agrees with the logits it was given (lowest index among equals).
      const auto top = std::max_element(got.begin(), got.end()) - got.begin();
      EXPECT_EQ(argmax[c], top) << where;
      double scale = 0;
      for (double value : want) scale = std::max(scale, std::fabs(value));
      const double margin = testing::top_margin(want);
      if (margin > kTolerance * scale) {
        EXPECT_EQ(argmax[c], testing::top_index(want))
            << where << ": reference margin " << margin << ", threshold " << kTolerance * scale
            << ", our logit there " << got[static_cast<std::size_t>(testing::top_index(want))]
            << " vs " << got[static_cast<std::size_t>(top)];
      }
    }
  }

  std::unique_ptr<Driver> driver_;
  std::uint64_t seed_ = 0;
  std::mt19937_64 random_;
  std::unique_ptr<testing::TinyModel> tiny_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<testing::KvArena> kv_;
};

TEST_P(CudaModelTest, ChunkedPrefillThenDecodesMatchTheReference) {
  const Sequence s = sequence(40);
  step({{&s, 0, 17}}, "prefill chunk 1");
  step({{&s, 17, 16}}, "prefill chunk 2");
  for (std::uint32_t position = 33; position < 40; ++position) {
    step({{&s, position, 1}}, "decode at " + std::to_string(position));
    if (HasFatalFailure()) return;
  }
}

TEST_P(CudaModelTest, APackedBatchOfTwoSequencesMatchesEachAlone) {
  const Sequence a = sequence(26), b = sequence(21);
  step({{&a, 0, 12}, {&b, 0, 9}}, "two prefills");
  step({{&a, 12, 1}, {&b, 9, 6}}, "a decode and a chunk");
  step({{&b, 15, 1}, {&a, 13, 1}}, "two decodes, b first");
  step({{&a, 14, 6}, {&b, 16, 1}}, "a chunk and a decode");
  for (std::uint32_t i = 0; i < 4; ++i) {
    step({{&a, 20 + i, 1}, {&b, 17 + i, 1}}, "decodes " + std::to_string(i));
    if (HasFatalFailure()) return;
  }
  step({{&a, 24, 2}}, "a alone");
}

TEST_P(CudaModelTest, MalformedBatchesAreRefusedAndTheModelStaysUsable) {
  const Sequence s = sequence(8);
  std::vector<std::int32_t> ids = s.ids;
  std::vector<Chunk> chunks = {{s.slot, 0, 8}};
  std::vector<float> logits(tiny_->config.vocab_size);
  auto run = [&](const KvView& view) {
    return model_->forward(StepBatch{ids, chunks, view}, StepOutput{logits.data(), nullptr});
  };
  const KvView view = kv_->arena->view();
  auto expect_refused = [&](Status status, const std::string& words) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find(words), std::string::npos) << status.to_string();
  };
  ids[3] = static_cast<std::int32_t>(tiny_->config.vocab_size);
  expect_refused(run(view), "outside the vocabulary");
  ids[3] = -1;
  expect_refused(run(view), "token id -1");
  ids = s.ids;
  chunks[0].tokens = 7;
  expect_refused(run(view), "token_ids has 8");
  chunks[0] = {s.slot, tiny_->config.max_position_embeddings - 4, 8};
  expect_refused(run(view), "max_position_embeddings");
  chunks[0] = {s.slot, 0, 8};
  KvView other = view;
  other.element = GetParam().kv == DType::kBf16 ? DType::kFp16 : DType::kBf16;
  expect_refused(run(other), "compute type");
  chunks.assign(5, Chunk{s.slot, 0, 1});
  ids.assign(5, 1);
  expect_refused(run(view), "at most 4");
  chunks = {{s.slot, 0, 0}};
  ids.clear();
  expect_refused(run(view), "0 tokens");
  // Still usable: the whole sequence as one chunk.
  step({{&s, 0, 8}}, "after refusals");
}

std::string case_name(const ::testing::TestParamInfo<Case>& param) { return param.param.name; }

INSTANTIATE_TEST_SUITE_P(Tiny, CudaModelTest, ::testing::ValuesIn(cases()), case_name);
#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::model
