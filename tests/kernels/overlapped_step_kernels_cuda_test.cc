// The decode step's kernels besides the projections launch overlapping the kernel before them
// (programmatic dependent launch): RMSNorm (both forms, and with its quantized copy), RoPE with
// the KV append, the decode attention (reading q and the keys the kernel before wrote), SiLU-mul
// (all three forms) and the argmax. Each must read its predecessor's output, not what the memory
// held before: support/late_copy_test.h writes the input 200 µs after the reader may start and
// checks the output bit for bit against the same call over the input in place. And with
// overlapped launches off (set_overlapped_launches(false)) they give the same bits. Skipped
// without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/kernels/model_kernels.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "support/decode_workspace.h"
#include "support/device_buffer.h"
#include "support/late_copy_test.h"
#endif

namespace kvvm::overlapped_step_kernels_cuda_test {
namespace {

#if defined(KVVM_HAS_CUDA_KERNELS)
using testing::bytes_of;
using testing::DeviceBuffer;
using testing::random_bf16;

// Llama-3-8B's shapes.
constexpr std::uint32_t kHidden = 4096, kInter = 14336;
constexpr std::uint32_t kQoHeads = 32, kKvHeads = 8, kHeadDim = 128;

// Rows of `width` bf16 outputs, then room for their quantized copy: the codes of
// fp8_padded_rows(rows) rows and their scales (at most one per 128 elements of a row).
struct RowsOut {
  RowsOut(std::uint32_t rows, std::uint32_t width)
      : stride(fp8_padded_rows(rows)),
        out_bytes(std::size_t{rows} * width * 2),
        code_bytes(std::size_t{stride} * width),
        buffer(out_bytes + code_bytes + std::size_t{width / 128} * stride * 4) {}

  // Form 0: no copy; 1: block-scaled; 2: per channel.
  QuantizedRows quantized(int form) const {
    QuantizedRows q;
    if (form == 0) return q;
    auto* bytes = static_cast<std::uint8_t*>(buffer.get());
    q.kind = form == 1 ? Fp8Scales::kBlock128 : Fp8Scales::kChannel;
    q.stride = stride;
    q.out = bytes + out_bytes;
    q.scales = reinterpret_cast<float*>(bytes + out_bytes + code_bytes);
    return q;
  }

  std::uint32_t stride;
  std::size_t out_bytes, code_bytes;
  DeviceBuffer buffer;
};

class OverlappedStepKernels : public testing::LateCopyTest {
 protected:
  // Puts overlapped launches back as they were, whatever a test set.
  void TearDown() override {
    set_overlapped_launches(true);
    LateCopyTest::TearDown();
  }

  // `read(input)` over `fresh` input with overlapped launches on, then off: the same bits.
  void expect_same_bits_in_order(const std::vector<std::uint8_t>& fresh, DeviceBuffer& out,
                                 const std::function<Status(const void*)>& read,
                                 const std::string& what) {
    DeviceBuffer input(fresh);
    std::vector<std::uint8_t> outputs[2];
    for (const bool overlapped : {true, false}) {
      set_overlapped_launches(overlapped);
      poison(out);
      const Status status = read(input.get());
      ASSERT_TRUE(status.ok()) << what << ": " << status.to_string();
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << what;
      outputs[overlapped ? 0 : 1] = out.download();
    }
    set_overlapped_launches(true);
    EXPECT_EQ(outputs[0], outputs[1]) << what << ": in-order launches give other bits";
  }

  void check(const std::vector<std::uint8_t>& fresh, const std::vector<std::uint8_t>& stale,
             DeviceBuffer& out, const std::function<Status(const void*)>& read,
             const std::string& what) {
    expect_reads_the_late_copy(fresh, stale, out, read, what);
    if (HasFatalFailure()) return;
    expect_same_bits_in_order(fresh, out, read, what);
  }
};

TEST_F(OverlappedStepKernels, RmsNormReadsThePreviousKernelsRowInEveryForm) {
  // 4,096 wide: the vector form (and its quantized copy, both scalings); 4,100: the loop form.
  for (const std::uint32_t hidden : {kHidden, kHidden + 4}) {
    DeviceBuffer weight(random_bf16(hidden, rng_));
    for (const int form : {0, 1, 2}) {
      if (form != 0 && hidden != kHidden) continue;
      constexpr std::uint32_t kRows = 2;
      RowsOut out(kRows, hidden);
      const auto read = [&](const void* x) {
        RmsNormParams p;
        p.element = DType::kBf16;
        p.rows = kRows;
        p.hidden = hidden;
        p.x = const_cast<void*>(x);  // not written without `add`
        p.weight = weight.get();
        p.out = out.buffer.get();
        p.quantized = out.quantized(form);
        return rmsnorm_cuda(p, stream_);
      };
      check(bytes_of(random_bf16(std::size_t{kRows} * hidden, rng_)),
            bytes_of(random_bf16(std::size_t{kRows} * hidden, rng_)), out.buffer, read,
            "rmsnorm_cuda, hidden " + std::to_string(hidden) + ", quantized form " +
                std::to_string(form));
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(OverlappedStepKernels, SiluMulReadsThePreviousKernelsRowsInEveryForm) {
  // Unquantized (the flat form), block-scaled (groups) and per channel (a block a row).
  for (const int form : {0, 1, 2}) {
    constexpr std::uint32_t kRows = 2;
    RowsOut out(kRows, kInter);
    const auto read = [&](const void* gate_up) {
      SiluMulParams p;
      p.element = DType::kBf16;
      p.rows = kRows;
      p.inter = kInter;
      p.gate_up = gate_up;
      p.out = out.buffer.get();
      p.quantized = out.quantized(form);
      return silu_mul_cuda(p, stream_);
    };
    check(bytes_of(random_bf16(std::size_t{kRows} * 2 * kInter, rng_)),
          bytes_of(random_bf16(std::size_t{kRows} * 2 * kInter, rng_)), out.buffer, read,
          "silu_mul_cuda, form " + std::to_string(form));
    if (HasFatalFailure()) return;
  }
}

TEST_F(OverlappedStepKernels, TheArgmaxReadsThePreviousKernelsLogits) {
  constexpr std::uint32_t kVocab = 128256, kRows = 2;
  std::uniform_real_distribution<float> logit(-10.0f, 10.0f);
  const auto logits = [&] {
    std::vector<float> values(std::size_t{kRows} * kVocab);
    for (float& v : values) v = logit(rng_);
    std::vector<std::uint8_t> bytes(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  };
  DeviceBuffer out(kRows * 4), workspace(std::size_t{kRows} * kArgmaxSplits * 8);
  for (const bool split : {true, false}) {
    const auto read = [&](const void* input) {
      ArgmaxParams p;
      p.rows = kRows;
      p.vocab = kVocab;
      p.logits = static_cast<const float*>(input);
      p.out = static_cast<std::int32_t*>(out.get());
      p.workspace = split ? static_cast<ArgmaxPartial*>(workspace.get()) : nullptr;
      return argmax_cuda(p, stream_);
    };
    check(logits(), logits(), out, read, split ? "argmax_cuda, split" : "argmax_cuda, one block");
    if (HasFatalFailure()) return;
  }
}

// A cache of one slot and one layer, token-major, in a plain device buffer.
KvView cache_view(const void* base, std::uint32_t tokens) {
  KvView view;
  view.base = reinterpret_cast<std::uint64_t>(base);
  view.element = DType::kBf16;
  view.element_bytes = 2;
  view.head_dim = kHeadDim;
  view.head_stride = kHeadDim * 2;
  view.kv_stride = std::uint64_t{kKvHeads} * view.head_stride;
  view.token_stride = 2 * view.kv_stride;
  view.layer_stride = view.slot_stride = std::uint64_t{tokens} * view.token_stride;
  return view;
}

TEST_F(OverlappedStepKernels, RopeAppendReadsThePreviousKernelsProjection) {
  constexpr std::uint32_t kTokens = 2, kStart = 5, kCacheTokens = kStart + kTokens;
  std::vector<float> inv_freq(kHeadDim / 2);
  for (std::uint32_t i = 0; i < kHeadDim / 2; ++i) {
    inv_freq[i] = std::pow(500000.0f, -2.0f * static_cast<float>(i) / kHeadDim);
  }
  DeviceBuffer frequencies(inv_freq);
  // q, then the cache the new keys and values land in.
  const std::size_t q_bytes = std::size_t{kTokens} * kQoHeads * kHeadDim * 2;
  DeviceBuffer out(q_bytes + std::size_t{kCacheTokens} * 2 * kKvHeads * kHeadDim * 2);
  const auto read = [&](const void* qkv) {
    RopeAppendParams p;
    p.append.view = cache_view(static_cast<std::uint8_t*>(out.get()) + q_bytes, kCacheTokens);
    p.append.kv_heads = kKvHeads;
    p.append.tokens = kTokens;
    p.append.start = kStart;
    p.qo_heads = kQoHeads;
    p.qkv = qkv;
    p.q_out = out.get();
    p.inv_freq = static_cast<const float*>(frequencies.get());
    return rope_append_kv_cuda(p, stream_);
  };
  const std::size_t width = std::size_t{kQoHeads + 2 * kKvHeads} * kHeadDim;
  check(bytes_of(random_bf16(kTokens * width, rng_)), bytes_of(random_bf16(kTokens * width, rng_)),
        out, read, "rope_append_kv_cuda");
}

// The decode attention over a short and a longer sequence, planned for a graph's bound (so the
// short one runs alone in its first chunk and the longer one merges chunks), reading q (the
// kernel before wrote it) or the cache (the kernel before appended to it) late.
TEST_F(OverlappedStepKernels, DecodeReadsThePreviousKernelsQueryAndKeys) {
  constexpr std::uint32_t kMaxLength = 8192, kChunk = 256;
  const std::vector<std::uint32_t> lengths = {100, 700};
  const std::uint32_t batch = static_cast<std::uint32_t>(lengths.size());
  const std::uint32_t cache_tokens = 700;
  const std::size_t q_elements = std::size_t{batch} * kQoHeads * kHeadDim;
  const std::size_t cache_elements = std::size_t{batch} * cache_tokens * 2 * kKvHeads * kHeadDim;
  DeviceBuffer slots(std::vector<std::uint32_t>{0, 1}), device_lengths(lengths);
  DeviceBuffer out(q_elements * 2);
  DeviceBuffer q(random_bf16(q_elements, rng_)), cache(random_bf16(cache_elements, rng_));
  DecodeParams base;
  base.qo_heads = kQoHeads;
  base.kv_heads = kKvHeads;
  base.batch = batch;
  base.slots = static_cast<const std::uint32_t*>(slots.get());
  base.lengths = static_cast<const std::uint32_t*>(device_lengths.get());
  base.max_length = kMaxLength;
  base.chunk_tokens = kChunk;
  base.q = q.get();
  base.out = out.get();
  base.view = cache_view(cache.get(), cache_tokens);
  Result<DecodePlan> plan = plan_decode_cuda(base);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_EQ(plan->chunks, kMaxLength / kChunk);
  DeviceBuffer workspace(testing::decode_workspace_bytes(*plan));
  testing::prepare_decode_workspace(workspace, *plan);
  const auto decode = [&](const void* query, const void* keys) {
    DecodeParams p = base;
    p.view = cache_view(keys, cache_tokens);
    p.q = query;
    return decode_attention_cuda(p, workspace.get(), workspace.bytes(), stream_);
  };
  check(
      bytes_of(random_bf16(q_elements, rng_)), bytes_of(random_bf16(q_elements, rng_)), out,
      [&](const void* input) { return decode(input, cache.get()); }, "decode_attention_cuda, q");
  if (HasFatalFailure()) return;
  check(
      bytes_of(random_bf16(cache_elements, rng_)), bytes_of(random_bf16(cache_elements, rng_)), out,
      [&](const void* input) { return decode(q.get(), input); },
      "decode_attention_cuda, the cache");
  EXPECT_EQ(testing::nonzero_counters(workspace, *plan), 0u);
}
#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::overlapped_step_kernels_cuda_test
