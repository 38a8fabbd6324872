// Token masks before a draw (structured output): mask_logits on a row; the CPU model's step with
// masks draws only allowed tokens (temperature 1, many counters), returns the masked logits and
// leaves unmasked chunks as they were; malformed masks are refused by name. On a GPU: the kernel
// against mask_logits bit for bit (a 152064 and a 300 vocabulary, rows without a mask untouched),
// and the CUDA model's masked steps (eager, with graphs captured too). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvvm/kernels/model_kernels.h"
#include "kvvm/model/model.h"
#include "kvvm/model/sampling.h"
#include "support/model_rig.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include "kvvm/vmm/cuda_driver.h"
#include "support/cuda_device.h"
#include "support/device_buffer.h"
#endif

namespace kvvm::model::token_mask_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<std::uint32_t> random_mask(std::uint32_t vocab, double keep, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution on(keep);
  std::vector<std::uint32_t> mask(token_mask_words(vocab), 0);
  for (std::uint32_t t = 0; t < vocab; ++t) {
    if (on(rng)) mask[t >> 5] |= 1u << (t & 31);
  }
  mask[0] |= 1u;  // never empty
  return mask;
}

bool allowed(const std::vector<std::uint32_t>& mask, std::size_t row_words, std::size_t row,
             std::int32_t t) {
  return (mask[row * row_words + (static_cast<std::size_t>(t) >> 5)] >> (t & 31)) & 1;
}

TEST(TokenMask, MaskLogitsBansExactlyTheZeroBits) {
  std::vector<float> logits = {1.0f,  2.0f,  -3.0f, 4.0f,  NAN,   0.0f,  7.0f,  8.0f,  9.0f,
                               10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f, 16.0f, 17.0f, 18.0f,
                               19.0f, 20.0f, 21.0f, 22.0f, 23.0f, 24.0f, 25.0f, 26.0f, 27.0f,
                               28.0f, 29.0f, 30.0f, 31.0f, 32.0f, 33.0f, 34.0f};
  const std::vector<float> raw = logits;
  const std::vector<std::uint32_t> mask = {0b1011u | (1u << 31), 0b10u};
  mask_logits(logits, mask);
  for (std::size_t t = 0; t < logits.size(); ++t) {
    const bool on = (mask[t >> 5] >> (t & 31)) & 1;
    if (on) {
      EXPECT_EQ(std::memcmp(&logits[t], &raw[t], sizeof(float)), 0) << t;
    } else {
      EXPECT_EQ(logits[t], -kInf) << t;
    }
  }
  // A draw from the masked row only ever takes allowed tokens.
  SamplingParams hot;
  hot.temperature = 2.0f;
  for (std::uint64_t n = 0; n < 500; ++n) {
    const std::int32_t t = sample_token(logits, hot, n);
    EXPECT_TRUE((mask[static_cast<std::size_t>(t) >> 5] >> (t & 31)) & 1) << t;
  }
}

struct Stepped {
  std::vector<float> logits;
  std::vector<std::int32_t> sampled;
  Status status;
};

Stepped step(testing::ModelRig& rig, std::vector<testing::Sequence>& seqs,
             const std::vector<ChunkSampling>& sampling, const std::vector<std::uint32_t>& masks) {
  std::vector<Chunk> chunks;
  std::vector<std::int32_t> ids;
  for (testing::Sequence& s : seqs) {
    chunks.push_back({s.slot, 0, static_cast<std::uint32_t>(s.tokens.size())});
    ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
  }
  StepBatch batch{ids, chunks, rig.arena().view(), sampling};
  batch.token_masks = masks;
  const std::uint32_t vocab = rig.model().config().vocab_size;
  Stepped r;
  r.logits.assign(chunks.size() * vocab, NAN);
  r.sampled.assign(chunks.size(), -1);
  r.status = rig.model().forward(batch, {r.logits.data(), nullptr, r.sampled.data()});
  return r;
}

TEST(ModelCpuTokenMask, TheStepDrawsOnlyAllowedTokens) {
  testing::ModelRig rig(testing::tiny_config(), TensorDType::kF32, Layout::kTokenMajor);
  ASSERT_TRUE(rig.ready());
  std::vector<testing::Sequence> seqs = {rig.admit(9, 1), rig.admit(11, 2), rig.admit(5, 3)};
  const std::uint32_t vocab = rig.model().config().vocab_size;
  const std::size_t words = token_mask_words(vocab);
  std::vector<ChunkSampling> sampling(3);
  for (ChunkSampling& s : sampling) s.params.temperature = 1.0f;
  const Stepped plain = step(rig, seqs, sampling, {});
  ASSERT_TRUE(plain.status.ok()) << plain.status.to_string();
  // Chunks 0 and 2 masked (rows 1 and 0: any order), chunk 1 free.
  for (std::uint64_t counter = 0; counter < 40; ++counter) {
    std::vector<std::uint32_t> masks = random_mask(vocab, 0.1, counter);
    const std::vector<std::uint32_t> second = random_mask(vocab, 0.05, counter + 1000);
    masks.insert(masks.end(), second.begin(), second.end());
    for (ChunkSampling& s : sampling) s.counter = counter;
    sampling[0].mask_row = 1;
    sampling[2].mask_row = 0;
    for (auto& s : seqs) s.written = 0;
    const Stepped masked = step(rig, seqs, sampling, masks);
    ASSERT_TRUE(masked.status.ok()) << masked.status.to_string();
    EXPECT_TRUE(allowed(masks, words, 1, masked.sampled[0])) << masked.sampled[0];
    EXPECT_TRUE(allowed(masks, words, 0, masked.sampled[2])) << masked.sampled[2];
    sampling[0].mask_row = sampling[2].mask_row = -1;
    const Stepped free = step(rig, seqs, sampling, {});
    EXPECT_EQ(masked.sampled[1], free.sampled[1]);  // the unmasked chunk draws as without
    for (std::uint32_t v = 0; v < vocab; ++v) {
      const float want0 =
          allowed(masks, words, 1, static_cast<std::int32_t>(v)) ? free.logits[v] : -kInf;
      ASSERT_EQ(masked.logits[v], want0) << "chunk 0 id " << v;
      ASSERT_EQ(masked.logits[vocab + v], free.logits[vocab + v]) << "chunk 1 id " << v;
    }
  }
}

TEST(ModelCpuTokenMask, MalformedMasksAreRefusedByName) {
  testing::ModelRig rig(testing::tiny_config(), TensorDType::kF32, Layout::kTokenMajor);
  ASSERT_TRUE(rig.ready());
  std::vector<testing::Sequence> seqs = {rig.admit(4, 1)};
  const std::uint32_t vocab = rig.model().config().vocab_size;
  std::vector<ChunkSampling> sampling(1);
  sampling[0].mask_row = 1;
  Stepped r = step(rig, seqs, sampling, random_mask(vocab, 0.5, 1));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("sampling[0].mask_row 1 is past the batch's 1 token mask rows"),
            std::string::npos)
      << r.status.message();
  sampling[0].mask_row = 0;
  std::vector<std::uint32_t> partial = random_mask(vocab, 0.5, 1);
  partial.pop_back();
  r = step(rig, seqs, sampling, partial);
  EXPECT_NE(r.status.message().find("whole rows of " + std::to_string(token_mask_words(vocab))),
            std::string::npos)
      << r.status.message();
  r = step(rig, seqs, sampling, std::vector<std::uint32_t>(token_mask_words(vocab), 0));
  EXPECT_NE(r.status.message().find("sampling[0].mask_row 0 allows no token"), std::string::npos)
      << r.status.message();
}

#if defined(KVVM_HAS_CUDA_KERNELS)

TEST(TokenMaskKernel, MatchesMaskLogitsBitForBit) {
  if (!testing::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  for (const std::uint32_t vocab : {152064u, 300u}) {
    const std::uint32_t rows = 3;
    const std::size_t words = token_mask_words(vocab);
    std::mt19937_64 rng(vocab);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(std::size_t{rows} * vocab);
    for (float& l : logits) l = normal(rng);
    logits[5] = NAN;
    std::vector<std::uint32_t> masks = random_mask(vocab, 0.3, 1);
    const std::vector<std::uint32_t> dense = random_mask(vocab, 0.97, 2);
    masks.insert(masks.end(), dense.begin(), dense.end());
    const std::vector<std::int32_t> mask_rows = {1, -1, 0};
    testing::DeviceBuffer d_logits(logits), d_masks(masks), d_rows(mask_rows);
    TokenMaskParams p{.rows = rows,
                      .vocab = vocab,
                      .words = static_cast<std::uint32_t>(words),
                      .logits = static_cast<float*>(d_logits.get()),
                      .mask_rows = static_cast<const std::int32_t*>(d_rows.get()),
                      .masks = static_cast<const std::uint32_t*>(d_masks.get())};
    ASSERT_TRUE(token_mask_cuda(p, nullptr).ok());
    const std::vector<std::uint8_t> bytes = d_logits.download();
    std::vector<float> got(logits.size());
    std::memcpy(got.data(), bytes.data(), bytes.size());
    std::vector<float> want = logits;
    for (std::uint32_t r = 0; r < rows; ++r) {
      if (mask_rows[r] < 0) continue;
      mask_logits(std::span<float>(want).subspan(std::size_t{r} * vocab, vocab),
                  std::span<const std::uint32_t>(masks).subspan(mask_rows[r] * words, words));
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << vocab;
  }
}

#endif

TEST(TokenMaskKernelChecks, MalformedCallsAreRefused) {
#if !defined(KVVM_HAS_CUDA_KERNELS)
  EXPECT_EQ(token_mask_cuda(TokenMaskParams{}, nullptr).code(), StatusCode::kUnavailable);
#else
  EXPECT_TRUE(token_mask_cuda(TokenMaskParams{}, nullptr).ok());  // zero rows: no launch
  float logits[4] = {};
  std::int32_t row = 0;
  std::uint32_t mask = 1;
  TokenMaskParams p{
      .rows = 1, .vocab = 4, .words = 2, .logits = logits, .mask_rows = &row, .masks = &mask};
  Status refused = token_mask_cuda(p, nullptr);
  EXPECT_NE(refused.message().find("2 words a row for a vocabulary of 4"), std::string::npos)
      << refused.to_string();
  p.words = 1;
  p.masks = nullptr;
  refused = token_mask_cuda(p, nullptr);
  EXPECT_NE(refused.message().find("masks is null"), std::string::npos) << refused.to_string();
#endif
}

}  // namespace
}  // namespace kvvm::model::token_mask_test
