// --speculative-config, which `generate`, `serve` and `bench engine` share: vLLM's JSON,
// read by engine::parse_speculative_config when the command runs.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>

#include "kit/model_loading.h"
#include "kvvm/base/status.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/engine/speculative.h"
#include "kvvm/model/config.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

// Adds --speculative-config JSON to `cmd`, bound to `json` (empty: off), checked when the
// flags are parsed by engine::parse_speculative_config, whose errors name the key.
void add_speculative_flag(CLI::App& cmd, std::string& json);

// The KV space of a draft model (draft_config) beside `target`'s: the same backend, device,
// layout, driver and governor, a slot for each of the target's sequences, a context k tokens
// longer (a full sequence's proposals are written after it), and a budget in the ratio of the
// two models' bytes per token (each draft sequence is as long as its target's), so the draft
// can never hold more of the device than its sequences need.
engine::KvSpaceOptions draft_kv_options(engine::KvSpace& target,
                                        const model::ModelConfig& draft_config,
                                        std::uint32_t num_speculative_tokens);

// A draft model loaded for `generate` and `serve`, with its KV space; declared before the
// engine that borrows them (lent()), so they outlive it.
struct LoadedDraft {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<engine::KvSpace> kv;
  engine::DraftModel lent() const { return {.model = model.get(), .kv = kv.get()}; }
};
// With `speculative`'s method kDraftModel: its checkpoint loaded beside `target`
// (load_draft_model) and a KV space beside `target_kv` (draft_kv_options); otherwise nothing
// (both null). The loader's errors, or the space's naming the draft's KV.
Result<LoadedDraft> load_draft(const engine::SpeculativeOptions& speculative,
                               const LoadedModel& target, engine::KvSpace& target_kv,
                               std::string_view command, std::ostream& err);

}  // namespace kvvm::cli
