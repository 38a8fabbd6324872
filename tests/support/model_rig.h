// A tiny random model's CPU forward pass beside its float64 reference: a rig that admits
// sequences into a host arena, runs steps of packed chunks and checks each chunk's last-token
// logits (and argmax) against the reference's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "kvvm/model/model.h"
#include "model/cpu/cpu_ops.h"
#include "support/reference_transformer.h"
#include "support/tiny_model.h"

namespace kvvm::testing {

constexpr double kTolerance = 1e-4;  // max |a - b| / max |b| of the logits, fp32 throughout
constexpr std::uint32_t kContext = 256;
constexpr std::uint32_t kSlots = 4;

inline std::vector<std::int32_t> random_tokens(std::size_t n, std::uint32_t vocab,
                                               std::uint64_t seed) {
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
  ModelRig(const model::ModelConfig& config, model::TensorDType dtype, Layout layout,
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
    std::vector<model::Chunk> chunks;
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
        model_->forward({ids, chunks, arena().view(), {}}, {logits.data(), argmax.data(), nullptr});
    EXPECT_TRUE(status.ok()) << status.to_string();
    double worst = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      Sequence& s = *parts[i];
      s.written += counts[i];
      const std::span<const float> got(&logits[i * vocab], vocab);
      const double diff = max_relative_difference(got, s.expected[s.written - 1]);
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

}  // namespace kvvm::testing
