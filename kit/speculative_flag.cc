#include "kit/speculative_flag.h"

#include <CLI/CLI.hpp>
#include <algorithm>

#include "kvvm/engine/engine.h"

namespace kvvm::cli {

void add_speculative_flag(CLI::App& cmd, std::string& json) {
  cmd.add_option(
         "--speculative-config", json,
         "Speculative decoding as vLLM configures it, JSON. N-gram prompt lookup: {\"method\": "
         "\"ngram\", \"num_speculative_tokens\": K, \"prompt_lookup_max\": M, "
         "\"prompt_lookup_min\": m, \"disable_by_batch_size\": B}: a decoding sequence whose last "
         "n tokens (m <= n <= M, default 5) occurred earlier proposes the up to K tokens that "
         "followed them. A draft model: {\"model\": DIR, \"num_speculative_tokens\": K}: a "
         "smaller checkpoint with the same vocabulary proposes its K most likely next tokens "
         "(loaded beside the model, its KV under the same budget). Either way the proposals are "
         "verified in the same step as extra rows, and the output is token for token what plain "
         "decoding gives, in fewer steps. B: no speculation while B or more sequences decode "
         "(default: never off). EAGLE heads are not built (default: off)")
      // Read as the flags are, so a bad key fails before a model is loaded.
      ->check([](const std::string& text) -> std::string {
        const Result<engine::SpeculativeOptions> read = engine::parse_speculative_config(text);
        return read.ok() ? std::string() : read.status().message();
      });
}

engine::KvSpaceOptions draft_kv_options(engine::KvSpace& target,
                                        const model::ModelConfig& draft_config,
                                        std::uint32_t num_speculative_tokens) {
  const engine::KvSpaceOptions& t = target.options();
  engine::KvSpaceOptions o;
  o.backend = t.backend;
  o.device = t.device;
  o.layout = t.layout;
  o.host_granule = t.host_granule;
  o.sequences =
      t.sequences != 0 ? t.sequences : std::max<std::uint32_t>(1, t.max_slots - engine::kPadSlots);
  o.max_context = t.max_context + num_speculative_tokens;
  o.driver = &target.driver();
  o.governor = &target.governor();
  const std::uint64_t target_bytes = target.arena().plan().geometry.bytes_per_token();
  const std::uint64_t draft_bytes =
      draft_config.kv_geometry(engine::default_kv_dtype(draft_config, t.backend)).bytes_per_token();
  // At least a few windows: a budget that rounds to nothing would refuse every proposal.
  o.budget_bytes = std::max<std::uint64_t>(
      t.budget_bytes / std::max<std::uint64_t>(target_bytes, 1) * draft_bytes,
      std::uint64_t{16} * target.driver().granule());
  return o;
}

Result<LoadedDraft> load_draft(const engine::SpeculativeOptions& speculative,
                               const LoadedModel& target, engine::KvSpace& target_kv,
                               std::string_view command, std::ostream& err) {
  LoadedDraft draft;
  if (!speculative.enabled() || speculative.method != engine::SpeculativeMethod::kDraftModel) {
    return draft;
  }
  KVVM_ASSIGN_OR_RETURN(draft.model,
                        load_draft_model(speculative.draft_model, target, command, err));
  Result<std::unique_ptr<engine::KvSpace>> space = engine::KvSpace::create(
      draft.model->config(),
      draft_kv_options(target_kv, draft.model->config(), speculative.num_speculative_tokens));
  if (!space.ok()) return space.status().with_context("the draft model's KV");
  draft.kv = std::move(space).value();
  return draft;
}

}  // namespace kvvm::cli
