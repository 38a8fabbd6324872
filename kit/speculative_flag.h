// --speculative-config, which `generate`, `serve` and `bench engine` share: vLLM's JSON,
// read by engine::parse_speculative_config when the command runs.
#pragma once

#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

// Adds --speculative-config JSON to `cmd`, bound to `json` (empty: off), checked when the
// flags are parsed by engine::parse_speculative_config, whose errors name the key.
void add_speculative_flag(CLI::App& cmd, std::string& json);

}  // namespace kvvm::cli
