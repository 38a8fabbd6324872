// The CUDA model (make_cuda_model) against the float64 ReferenceTransformer of tests/support
// on tiny random models (support/tiny_model.h), fresh weights each run: Qwen2-like (q/k/v
// biases, tied embeddings) in bf16 and fp16, Llama-like (o bias, untied lm_head, llama3
// RoPE scaling, an F32 checkpoint run in bf16) and Qwen3-like (q/k norms, heads apart from
// hidden / heads, untied; on the fused and the unfused step), and the three mixtures of
// experts (Qwen3-MoE with a dense layer among sparse ones, Mixtral in fp16, Qwen2-MoE with its
// shared expert), head dim 64 with grouped-query attention. The KV lives in a CUDA-driver arena
// with only each sequence's windows committed. Checked: the last logits of every chunk of a chunked
// prefill followed by decodes, and of a packed batch of two sequences mixing prefill chunks and
// decodes in one step, within 2e-2 (max |ours - reference| / max |reference|); the argmax equal to
// our logits' and to the reference's wherever its top-2 margin exceeds twice the tolerance of the
// largest logit; malformed batches refused with the model still usable after. Skipped without a
// GPU; what a build or machine without one answers is checked everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kvvm/model/model.h"
#include "kvvm/vmm/cuda_driver.h"
#include "support/attention_support.h"
#include "support/pattern.h"
#include "support/reference_transformer.h"
#include "support/tiny_model.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include "model/cuda/cublas_api.h"
#endif

namespace kvvm::model {
namespace {

// A host emulation of the bf16 rounding (these configs, 20 seeds, 40 positions) stayed
// within 4e-3 (Qwen2-like) and 1.0e-2 (Llama-like, whose F32 weights are rounded to bf16 while
// the reference keeps them exact); a third layer took the latter to 1.5e-2.
constexpr double kTolerance = 2e-2;
constexpr std::uint32_t kContext = 256;

// Qwen2-like: q/k/v biases, tied embeddings, theta 1e6.
ModelConfig qwen_config() { return testing::tiny_cuda_config(kContext); }

TEST(CudaModelAvailability, WithoutADeviceOrKernelsTheModelIsUnavailable) {
  const testing::TinyModel tiny(qwen_config(), TensorDType::kBf16, 1);
  auto made = make_cuda_model(tiny.config(), tiny.weights(), CudaModelOptions{});
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
// libcublas loads without a GPU: every symbol of the table is looked up by its exact name.
TEST(CudaModelAvailability, CublasLoadsAtRunTimeWithEverySymbol) {
  const detail::CublasLibrary& cublas = detail::cublas_library();
  if (!cublas.usable()) GTEST_SKIP() << cublas.error;
  EXPECT_NE(cublas.api.create, nullptr);
  EXPECT_NE(cublas.api.gemm_ex, nullptr);
  EXPECT_EQ(detail::cublas_status_name(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}

// Checked before any CUDA call, so this runs without a GPU too.
TEST(CudaModelAvailability, AHeadDimTheKernelsLackIsRefusedByName) {
  ModelConfig config = qwen_config();
  config.head_dim = 96;
  const testing::TinyModel tiny(config, TensorDType::kBf16, 1);
  auto made = make_cuda_model(tiny.config(), tiny.weights(), CudaModelOptions{});
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument) << made.status().to_string();
  EXPECT_NE(made.status().message().find("head dim 96"), std::string::npos);
}

// Llama-like: an o bias, untied lm_head, llama3 scaling, heads * head_dim != hidden.
ModelConfig llama_config() {
  ModelConfig c = testing::tiny_config();
  c.hidden_size = 192;
  c.intermediate_size = 320;
  c.heads = 6;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 257;
  c.o_bias = true;
  c.rope.theta = 500000.0;
  c.rope.scaling = RopeScaling::kLlama3;
  c.rope.factor = 8.0;
  c.rope.low_freq_factor = 1.0;
  c.rope.high_freq_factor = 4.0;
  c.rope.original_max_position = 64;
  c.max_position_embeddings = kContext;
  return c;
}

// Qwen3-like: q/k norms before RoPE, 4 heads of 64 over hidden 192, no biases, untied.
ModelConfig qwen3_config() {
  ModelConfig c = testing::tiny_config();
  c.architecture = "Qwen3ForCausalLM";
  c.hidden_size = 192;
  c.intermediate_size = 384;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 263;
  c.qk_norm = true;
  c.rms_norm_eps = 1e-6;
  c.rope.theta = 1000000.0;
  c.max_position_embeddings = kContext;
  c.dtype = DType::kBf16;
  return c;
}

struct Case {
  std::string name;
  ModelConfig config;
  TensorDType dtype;  // of the checkpoint's tensors
  DType compute;      // what the options ask for
  DType runs_in;      // the compute type that gives (and the KV's)
  bool fused = true;  // CudaModelOptions::fused
};

// GoogleTest prints a parameter's bytes unless told how: its name says what it is.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> cases() {
  return {
      {"qwen2_bf16", qwen_config(), TensorDType::kBf16, DType::kUnset, DType::kBf16, true},
      {"qwen2_fp16", qwen_config(), TensorDType::kBf16, DType::kFp16, DType::kFp16, true},
      {"llama3_f32_as_bf16", llama_config(), TensorDType::kF32, DType::kUnset, DType::kBf16, true},
      {"qwen3_bf16", qwen3_config(), TensorDType::kBf16, DType::kUnset, DType::kBf16, true},
      {"qwen3_fp16_unfused", qwen3_config(), TensorDType::kBf16, DType::kFp16, DType::kFp16, false},
      // The mixtures: router, top k, permutation, grouped expert GEMMs and combine on the device.
      {"qwen3_moe_bf16", testing::tiny_cuda_moe_config("qwen3_moe", kContext), TensorDType::kBf16,
       DType::kUnset, DType::kBf16, true},
      {"mixtral_fp16", testing::tiny_cuda_moe_config("mixtral", kContext), TensorDType::kBf16,
       DType::kFp16, DType::kFp16, true},
      {"qwen2_moe_bf16", testing::tiny_cuda_moe_config("qwen2_moe", kContext), TensorDType::kBf16,
       DType::kUnset, DType::kBf16, true}};
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
    const Case& c = GetParam();
    tiny_ = std::make_unique<testing::TinyModel>(c.config, c.dtype, seed_);
    reference_ = std::make_unique<testing::ReferenceTransformer>(c.config, tiny_->weights());
    CudaModelOptions options;
    options.limits.max_step_tokens = 64;
    options.limits.max_chunks = 4;
    options.compute = c.compute;
    options.fused = c.fused;
    auto made = make_cuda_model(c.config, tiny_->weights(), options);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    model_ = std::move(made).value();
    EXPECT_EQ(model_->backend(), Backend::kCuda);
    kv_ = testing::KvArena::make(*driver_, c.config.kv_geometry(c.runs_in), Layout::kTokenMajor,
                                 kContext, 4);
    ASSERT_TRUE(kv_);
  }

  // A sequence of `length` random tokens in a slot committed through its end.
  struct Sequence {
    std::vector<std::int32_t> ids;
    SlotId slot = 0;
    std::vector<std::vector<double>> reference;  // logits of every position
  };
  Sequence sequence(std::size_t length) {
    Sequence s;
    s.ids.resize(length);
    for (auto& id : s.ids) id = static_cast<std::int32_t>(random_() % GetParam().config.vocab_size);
    auto slot = kv_->arena->admit(length);
    EXPECT_TRUE(slot.ok()) << slot.status().to_string();
    s.slot = slot.ok() ? *slot : 0;
    s.reference = reference_->logits(s.ids);
    return s;
  }

  // One step over (sequence, start, tokens) pieces; each chunk's last logits and greedy token
  // checked against its sequence's reference.
  struct Piece {
    const Sequence* sequence;
    std::uint32_t start;
    std::uint32_t tokens;
  };
  // One bar for every config. The mixtures' cases fail on some random seeds (2.2e-2, 3.3e-2 and
  // 0.12 seen on an H100): a router near-tie flips an expert under bf16 rounding, so their
  // comparison needs the reference's routing margins (skip a position whose margin bf16 can
  // cross), which the reference does not report yet.
  double tolerance() const { return kTolerance; }
  void step(const std::vector<Piece>& pieces, const std::string& what) {
    std::vector<Chunk> chunks;
    std::vector<std::int32_t> ids;
    for (const Piece& piece : pieces) {
      chunks.push_back({piece.sequence->slot, piece.start, piece.tokens});
      ids.insert(ids.end(), piece.sequence->ids.begin() + piece.start,
                 piece.sequence->ids.begin() + piece.start + piece.tokens);
    }
    const std::uint32_t vocab = GetParam().config.vocab_size;
    std::vector<float> logits(pieces.size() * vocab, NAN);
    std::vector<std::int32_t> argmax(pieces.size(), -1);
    Status done = model_->forward(StepBatch{ids, chunks, kv_->arena->view(), {}},
                                  StepOutput{logits.data(), argmax.data(), nullptr});
    ASSERT_TRUE(done.ok()) << what << ": " << done.to_string();
    for (std::size_t c = 0; c < pieces.size(); ++c) {
      const Piece& piece = pieces[c];
      const std::vector<double>& want = piece.sequence->reference[piece.start + piece.tokens - 1];
      const std::span<const float> got(&logits[c * vocab], vocab);
      const std::string where =
          what + ", chunk " + std::to_string(c) + " [" + std::to_string(piece.start) + ", " +
          std::to_string(piece.start + piece.tokens) + "), seed " + std::to_string(seed_);
      EXPECT_LE(testing::max_relative_difference(got, want), tolerance()) << where;
      // The argmax kernel agrees with the logits it was given (lowest index among equals).
      const auto top = std::max_element(got.begin(), got.end()) - got.begin();
      EXPECT_EQ(argmax[c], top) << where;
      // And with the reference's choice wherever the tolerance cannot flip it.
      const auto ref_top = std::max_element(want.begin(), want.end()) - want.begin();
      double scale = 0, second = -INFINITY;
      for (std::size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::fabs(want[i]));
        if (static_cast<std::ptrdiff_t>(i) != ref_top) second = std::max(second, want[i]);
      }
      const double margin = want[static_cast<std::size_t>(ref_top)] - second;
      if (margin > 2 * tolerance() * scale) {
        EXPECT_EQ(argmax[c], ref_top)
            << where << ": reference margin " << margin << " (scale " << scale
            << "), our logits there " << got[ref_top] << " vs " << got[top];
      }
    }
  }

  std::unique_ptr<Driver> driver_;
  std::uint64_t seed_ = 0;
  std::mt19937_64 random_;
  std::unique_ptr<testing::TinyModel> tiny_;
  std::unique_ptr<testing::ReferenceTransformer> reference_;
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
  std::vector<float> logits(GetParam().config.vocab_size);
  auto run = [&](const KvView& view) {
    return model_->forward(StepBatch{ids, chunks, view, {}},
                           StepOutput{logits.data(), nullptr, nullptr});
  };
  const KvView view = kv_->arena->view();
  auto expect_refused = [&](const Status& status, const std::string& words) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find(words), std::string::npos) << status.to_string();
  };
  ids[3] = static_cast<std::int32_t>(GetParam().config.vocab_size);
  expect_refused(run(view), "outside the vocabulary");
  ids[3] = -1;
  expect_refused(run(view), "= -1 is outside the vocabulary");
  ids = s.ids;
  chunks[0].tokens = 7;
  expect_refused(run(view), "token_ids has 8");
  chunks[0] = {s.slot, kContext - 4, 8};
  expect_refused(run(view), "max_position_embeddings");
  chunks[0] = {s.slot, 0, 8};
  KvView other = view;
  other.element = GetParam().runs_in == DType::kBf16 ? DType::kFp16 : DType::kBf16;
  expect_refused(run(other), "compute type");
  chunks.assign(5, Chunk{s.slot, 0, 1});
  ids.assign(5, 1);
  expect_refused(run(view), "above max_chunks 4");
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
