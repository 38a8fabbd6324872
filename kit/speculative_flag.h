// --speculative-config, which `generate`, `serve` and `bench engine` share: vLLM's JSON,
// read by engine::parse_speculative_config when the command runs.
#pragma once

#include <cstdint>
#include <string>

#include "kvvm/engine/kv_space.h"
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

}  // namespace kvvm::cli
