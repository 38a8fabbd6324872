// The mixtures of experts' config.json: Qwen3-MoE, Mixtral and Qwen2-MoE as released (their
// published numbers), the sparse-layer rule, and every other routing scheme refused by its field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kvvm/model/config.h"
#include "kvvm/model/weight_memory.h"
#include "support/model_config_json.h"

namespace kvvm::model {
namespace {

using namespace test::model_config;  // llama(), parse(), refusal(), contains()

// Qwen3-30B-A3B's config.json, as released.
nlohmann::json qwen3_30b_a3b() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"hidden_size", 2048},
          {"intermediate_size", 6144},
          {"moe_intermediate_size", 768},
          {"num_hidden_layers", 48},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 4},
          {"head_dim", 128},
          {"num_experts", 128},
          {"num_experts_per_tok", 8},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", nlohmann::json::array()},
          {"output_router_logits", false},
          {"router_aux_loss_coef", 0.001},
          {"vocab_size", 151936},
          {"max_position_embeddings", 40960},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"use_sliding_window", false},
          {"sliding_window", nullptr},
          {"max_window_layers", 48},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"bos_token_id", 151643},
          {"eos_token_id", 151645}};
}

// Mixtral-8x7B-v0.1's.
nlohmann::json mixtral_8x7b() {
  return {{"architectures", {"MixtralForCausalLM"}},
          {"model_type", "mixtral"},
          {"hidden_size", 4096},
          {"intermediate_size", 14336},
          {"num_hidden_layers", 32},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 8},
          {"num_local_experts", 8},
          {"num_experts_per_tok", 2},
          {"router_aux_loss_coef", 0.02},
          {"vocab_size", 32000},
          {"max_position_embeddings", 32768},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 1000000.0},
          {"sliding_window", nullptr},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

// Qwen2-57B-A14B's.
nlohmann::json qwen2_57b_a14b() {
  return {{"architectures", {"Qwen2MoeForCausalLM"}},
          {"model_type", "qwen2_moe"},
          {"hidden_size", 3584},
          {"intermediate_size", 18944},
          {"moe_intermediate_size", 2560},
          {"shared_expert_intermediate_size", 20480},
          {"num_hidden_layers", 28},
          {"num_attention_heads", 28},
          {"num_key_value_heads", 4},
          {"num_experts", 64},
          {"num_experts_per_tok", 8},
          {"norm_topk_prob", false},
          {"decoder_sparse_step", 1},
          {"vocab_size", 151936},
          {"max_position_embeddings", 131072},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"use_sliding_window", false},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"bos_token_id", 151643},
          {"eos_token_id", 151643}};
}

TEST(MoeConfig, Qwen3ThirtyBillionHasThePublishedNumbers) {
  Result<ModelConfig> c = parse(qwen3_30b_a3b());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(c->moe.experts, 128u);
  EXPECT_EQ(c->moe.top_k, 8u);
  EXPECT_EQ(c->moe.expert_intermediate, 768u);
  EXPECT_TRUE(c->moe.renormalize);
  EXPECT_EQ(c->moe.shared_intermediate, 0u);
  EXPECT_EQ(c->moe.naming, ExpertNaming::kQwen);
  EXPECT_EQ(c->moe.sparse_layers(), 48u);
  EXPECT_TRUE(c->qk_norm);  // Qwen3's attention
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->head_dim, 128u);  // not hidden / heads (64)

  // 48 layers of 128 experts of 3 x 768 x 2048 bf16 (9 MiB each): 56.6 GiB of experts, the
  // published 30.5B parameters' bulk; the dense part (attention, embeddings, routers) 3.3 GB.
  const WeightSizes sizes = weight_sizes(*c, DType::kBf16);
  EXPECT_EQ(sizes.expert_bytes, 3ull * 768 * 2048 * 2);
  EXPECT_EQ(sizes.expert_total(), 48ull * 128 * 3 * 768 * 2048 * 2);
  EXPECT_GT(sizes.dense_total(), 3'000'000'000ull);
  EXPECT_LT(sizes.dense_total(), 3'500'000'000ull);
  // The active weights a token reads: the dense part and 8 experts a layer, about 3.3B params.
  const double active =
      static_cast<double>(sizes.dense_total()) + 48.0 * 8 * static_cast<double>(sizes.expert_bytes);
  EXPECT_GT(active / 2, 3.0e9);
  EXPECT_LT(active / 2, 3.5e9);
}

TEST(MoeConfig, MixtralsExpertsAreItsMlpsAndAlwaysRenormalise) {
  Result<ModelConfig> c = parse(mixtral_8x7b());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->moe.experts, 8u);
  EXPECT_EQ(c->moe.top_k, 2u);
  EXPECT_EQ(c->moe.expert_intermediate, 14336u);
  EXPECT_TRUE(c->moe.renormalize);
  EXPECT_EQ(c->moe.naming, ExpertNaming::kMixtral);
  EXPECT_EQ(c->moe.sparse_layers(), 32u);
  // 46.7B parameters: 93 GB in bf16, 90 of them experts.
  const WeightSizes sizes = weight_sizes(*c, DType::kBf16);
  EXPECT_GT(sizes.total(), 93'000'000'000ull);
  EXPECT_LT(sizes.total(), 94'000'000'000ull);
  EXPECT_EQ(sizes.expert_total(), 32ull * 8 * 3 * 14336 * 4096 * 2);
}

TEST(MoeConfig, MixtralsSlidingWindowIsRefusedByName) {
  nlohmann::json json = mixtral_8x7b();
  json["sliding_window"] = 4096;
  EXPECT_TRUE(contains(refusal(json), "'sliding_window' is 4096"));
}

TEST(MoeConfig, Qwen2MoeHasASharedExpertAndQkvBiases) {
  Result<ModelConfig> c = parse(qwen2_57b_a14b());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->moe.experts, 64u);
  EXPECT_EQ(c->moe.shared_intermediate, 20480u);
  EXPECT_FALSE(c->moe.renormalize);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->qk_norm);
  nlohmann::json json = qwen2_57b_a14b();
  json["qkv_bias"] = true;
  EXPECT_TRUE(parse(json).ok());
  json["qkv_bias"] = false;
  EXPECT_TRUE(contains(refusal(json), "'qkv_bias' is false"));
  json.erase("qkv_bias");
  json.erase("shared_expert_intermediate_size");
  EXPECT_TRUE(contains(refusal(json), "'shared_expert_intermediate_size' is missing"));
}

TEST(MoeConfig, SparseLayersFollowTheStepAndTheDenseList) {
  nlohmann::json json = qwen3_30b_a3b();
  json["num_hidden_layers"] = 6;
  json["decoder_sparse_step"] = 2;
  json["mlp_only_layers"] = {3};
  Result<ModelConfig> c = parse(json);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // (l + 1) % 2 == 0: layers 1, 3, 5; 3 listed dense.
  EXPECT_EQ(c->moe.sparse, (std::vector<bool>{false, true, false, false, false, true}));
  // Every block holds both parts (one size for all layers): the dense MLP and the experts.
  const WeightSizes sizes = weight_sizes(*c, DType::kBf16);
  EXPECT_EQ(sizes.sparse_layers, 2u);
  EXPECT_GT(sizes.layer_bytes, 128ull * sizes.expert_bytes + 3ull * 6144 * 2048 * 2);

  json["mlp_only_layers"] = {7};
  EXPECT_TRUE(contains(refusal(json), "'mlp_only_layers[0]' is 7"));
  json["mlp_only_layers"] = {1, 3, 5};
  EXPECT_TRUE(contains(refusal(json), "no layer is sparse"));
}

TEST(MoeConfig, ExpertCountsAreBounded) {
  nlohmann::json json = qwen3_30b_a3b();
  json["num_experts_per_tok"] = 129;
  EXPECT_TRUE(contains(refusal(json), "'num_experts_per_tok' is 129"));
  json["num_experts_per_tok"] = 8;
  json["num_experts"] = 4096;
  EXPECT_TRUE(contains(refusal(json), "'num_experts' is 4096"));
  json.erase("num_experts");
  EXPECT_TRUE(contains(refusal(json), "'num_experts' is missing"));
  // transformers 5 saves Qwen3-MoE's count under Mixtral's name: read, and held to agree.
  json["num_local_experts"] = 64;
  auto read = parse(json);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->moe.experts, 64u);
  json["num_experts"] = 128;
  EXPECT_TRUE(contains(refusal(json), "num_experts 128 and num_local_experts 64 disagree"));
  json = qwen3_30b_a3b();
  json.erase("moe_intermediate_size");
  EXPECT_TRUE(contains(refusal(json), "'moe_intermediate_size' is missing"));
}

// An FP8 checkpoint's list of unquantized modules names its routers (as transformers writes
// them); an expert projection listed is refused, a dense layer's MLP only where it has one.
TEST(MoeConfig, Fp8ListsMayNameTheRoutersButNoExpert) {
  nlohmann::json json = qwen3_30b_a3b();
  json["quantization_config"] = {
      {"quant_method", "fp8"},
      {"fmt", "e4m3"},
      {"activation_scheme", "dynamic"},
      {"weight_block_size", {128, 128}},
      {"modules_to_not_convert", {"lm_head", "model.layers.0.mlp.gate"}}};
  auto read = parse(json);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->weight_quant, model::WeightQuant::kFp8Block);
  json["quantization_config"]["modules_to_not_convert"] = {"model.layers.3.mlp.experts.5.up_proj"};
  EXPECT_TRUE(contains(refusal(json), "leaves model.layers.3.mlp.experts.5.up_proj unquantized"));
  json["quantization_config"]["modules_to_not_convert"] = {"model.layers.3.mlp.gate_proj"};
  EXPECT_TRUE(parse(json).ok()) << "a sparse layer has no dense gate_proj to leave";
  json["mlp_only_layers"] = {3};
  EXPECT_TRUE(contains(refusal(json), "leaves model.layers.3.mlp.gate_proj unquantized"));
}

TEST(MoeConfig, OtherRoutersAreRefusedByTheirField) {
  struct Case {
    const char* field;
    nlohmann::json value;
  };
  for (const Case& c : {Case{"n_group", 8}, Case{"topk_group", 4}, Case{"topk_method", "noaux_tc"},
                        Case{"scoring_func", "sigmoid"}, Case{"routed_scaling_factor", 2.5},
                        Case{"n_shared_experts", 1}, Case{"e_score_correction_bias", true},
                        Case{"router_bias", true}, Case{"first_k_dense_replace", 3}}) {
    nlohmann::json json = qwen3_30b_a3b();
    json[c.field] = c.value;
    const std::string why = refusal(json);
    EXPECT_TRUE(contains(why, std::string("'") + c.field + "'")) << why;
    EXPECT_TRUE(contains(why, "not implemented")) << why;
  }
  // Their neutral values mean the routing above and are taken.
  nlohmann::json json = qwen3_30b_a3b();
  json["n_group"] = 1;
  json["scoring_func"] = "softmax";
  json["routed_scaling_factor"] = 1.0;
  EXPECT_TRUE(parse(json).ok());
}

TEST(MoeConfig, TheModelTypeAloneNamesTheFamily) {
  nlohmann::json json = mixtral_8x7b();
  json.erase("architectures");
  Result<ModelConfig> c = parse(json);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "MixtralForCausalLM");
  json["model_type"] = "deepseek_v3";
  EXPECT_TRUE(contains(refusal(json), "qwen3_moe, mixtral or qwen2_moe"));
}

TEST(MoeConfig, ADenseModelHasNoExperts) {
  Result<ModelConfig> c = parse(llama());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->moe.enabled());
  EXPECT_FALSE(c->moe.sparse_layer(0));
  const WeightSizes sizes = weight_sizes(*c, DType::kBf16);
  EXPECT_EQ(sizes.expert_total(), 0u);
  EXPECT_EQ(sizes.dense_total(), sizes.total());
}

TEST(MoeConfig, Fp8ExpertsKeepTheirScalesAndTheRouterStaysBf16) {
  nlohmann::json json = qwen3_30b_a3b();
  json["quantization_config"] = {{"quant_method", "fp8"},
                                 {"activation_scheme", "dynamic"},
                                 {"fmt", "e4m3"},
                                 {"weight_block_size", {128, 128}}};
  Result<ModelConfig> c = parse(json);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const WeightSizes sizes = weight_sizes(*c, DType::kBf16);
  // e4m3 gate|up and down, then float32 scales: gate|up 12 x 16 blocks, down 16 x (6 -> 8).
  EXPECT_EQ(sizes.expert_bytes, 3ull * 768 * 2048 + 12 * 16 * 4 + 16 * 8 * 4);
  bool bf16_seen = false;
  for (const auto& [type, bytes] : sizes.bytes_by_type()) {
    if (type != "bf16") continue;
    bf16_seen = true;
    EXPECT_GT(bytes, 48ull * 128 * 2048 * 2);  // the routers among them
  }
  EXPECT_TRUE(bf16_seen);
}

}  // namespace
}  // namespace kvvm::model
