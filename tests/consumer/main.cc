// A consumer of the installed package: commits and releases one granule through kvvm::kvvm on
// the host driver, then writes K/V into it and runs the CPU decode attention through
// kvvm::kernels, checking the answer against one computed here; then the model runtime's
// layers: a byte-level BPE tokenizer (PCRE2, utf8proc), a model config, a greedy sample.
#include <kvvm/kernels/attention.h>
#include <kvvm/model/config.h>
#include <kvvm/model/sampling.h>
#include <kvvm/tokenizer/tokenizer.h>
#include <kvvm/vmm/handle_pool.h>
#include <kvvm/vmm/host_driver.h>
#include <kvvm/vmm/reservation.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int fail(const kvvm::Status& status) {
  std::printf("consumer: %s\n", status.to_string().c_str());
  return 1;
}

// One sequence, one layer, one KV head of dimension 4, float32 K/V token by token at `base`:
// decode one query over `tokens` tokens and compare with softmax(q.k / 2) . v.
int check_attention(std::uint64_t base) {
  constexpr std::uint32_t kDim = 4, kTokens = 3;
  kvvm::KvView view;
  view.base = base;
  view.element = kvvm::DType::kFp32;
  view.element_bytes = 4;
  view.head_dim = kDim;
  view.token_stride = 2 * kDim * 4;  // K then V of each token
  view.kv_stride = kDim * 4;
  view.head_stride = view.layer_stride = view.slot_stride = view.token_stride * kTokens;
  std::vector<float> k(kTokens * kDim), v(kTokens * kDim), q(kDim), out(kDim, NAN);
  for (std::uint32_t i = 0; i < kTokens * kDim; ++i) {
    k[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;
    v[i] = static_cast<float>(i) / 7.0f;
  }
  for (std::uint32_t d = 0; d < kDim; ++d) q[d] = 0.5f - 0.3f * static_cast<float>(d);
  kvvm::AppendParams append;
  append.view = view;
  append.kv_heads = 1;
  append.tokens = kTokens;
  append.k = k.data();
  append.v = v.data();
  if (kvvm::Status s = kvvm::append_kv_cpu(append); !s.ok()) return fail(s);
  const std::uint32_t slot = 0, length = kTokens;
  kvvm::DecodeParams decode;
  decode.view = view;
  decode.qo_heads = decode.kv_heads = decode.batch = 1;
  decode.q = q.data();
  decode.slots = &slot;
  decode.lengths = &length;
  decode.max_length = kTokens;
  decode.out = out.data();
  if (kvvm::Status s = kvvm::decode_attention_cpu(decode, 1); !s.ok()) return fail(s);
  double weights[kTokens], sum = 0;
  for (std::uint32_t t = 0; t < kTokens; ++t) {
    double dot = 0;
    for (std::uint32_t d = 0; d < kDim; ++d) dot += double{q[d]} * k[t * kDim + d];
    weights[t] = std::exp(dot / std::sqrt(double{kDim}));
    sum += weights[t];
  }
  for (std::uint32_t d = 0; d < kDim; ++d) {
    double expected = 0;
    for (std::uint32_t t = 0; t < kTokens; ++t) expected += weights[t] / sum * v[t * kDim + d];
    if (!(std::fabs(out[d] - expected) < 1e-5)) {
      std::printf("consumer: attention output %u is %f, expected %f\n", d, out[d], expected);
      return 1;
    }
  }
  return 0;
}

// Two merges over the byte-level characters of "ab": "a b" then "ab c"; "abc" is one token.
int check_runtime() {
  const char* tokenizer_json = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2,
      "ab": 3, "abc": 4}, "merges": ["a b", "ab c"]},
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
      "decoder": {"type": "ByteLevel"}})";
  auto tokenizer = kvvm::tokenizer::Tokenizer::parse(tokenizer_json, "consumer");
  if (!tokenizer.ok()) return fail(tokenizer.status());
  const std::vector<kvvm::tokenizer::TokenId> ids = (*tokenizer)->encode("abc");
  if (ids != std::vector<kvvm::tokenizer::TokenId>{4} || (*tokenizer)->decode(ids) != "abc") {
    std::printf("consumer: the tokenizer did not merge \"abc\" into one token\n");
    return 1;
  }
  auto config = kvvm::model::parse_model_config(
      R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 16, "rms_norm_eps": 1e-5, "max_position_embeddings": 32})",
      "consumer");
  if (!config.ok()) return fail(config.status());
  if (config->head_dim != 16 || config->kv_heads != 2) {
    std::printf("consumer: config read head_dim %u, kv_heads %u\n", config->head_dim,
                config->kv_heads);
    return 1;
  }
  const float logits[] = {0.5f, 2.0f, -1.0f};
  if (kvvm::model::sample_token(logits, kvvm::model::SamplingParams{}, 0) != 1) {
    std::printf("consumer: greedy sampling did not pick the largest logit\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  auto driver = kvvm::make_host_driver();
  if (!driver.ok()) return fail(driver.status());
  kvvm::HandlePool pool(**driver);
  const std::size_t granule = pool.granule();
  auto reservation = kvvm::Reservation::create(pool, 4 * granule);
  if (!reservation.ok()) return fail(reservation.status());
  kvvm::Status status = (*reservation)->commit(granule, granule, nullptr);
  if (!status.ok()) return fail(status);
  const std::uint64_t window = (*reservation)->base() + granule;
  std::memset(reinterpret_cast<void*>(window), 0x5a, granule);
  if (check_attention(window) != 0) return 1;
  if (check_runtime() != 0) return 1;
  status = (*reservation)->release(granule, granule);
  if (!status.ok()) return fail(status);
  std::printf(
      "consumer: committed and released one %zu-byte granule through kvvm::kvvm and ran the CPU "
      "decode attention over it through kvvm::kernels; tokenized, read a config and sampled "
      "through kvvm::tokenizer, kvvm::model and kvvm::engine\n",
      granule);
  return 0;
}
