#include "kit/speculative_flag.h"

#include <CLI/CLI.hpp>

#include "kvvm/engine/engine.h"

namespace kvvm::cli {

void add_speculative_flag(CLI::App& cmd, std::string& json) {
  cmd.add_option(
         "--speculative-config", json,
         "Speculative decoding as vLLM configures it, JSON: {\"method\": \"ngram\", "
         "\"num_speculative_tokens\": K, \"prompt_lookup_max\": M, \"prompt_lookup_min\": m, "
         "\"disable_by_batch_size\": B}. A decoding sequence whose last n tokens (m <= n <= M, "
         "default 5) occurred earlier proposes the up to K tokens that followed them, verified in "
         "the same step as extra rows; the output is token for token what plain decoding gives, "
         "in fewer steps. B: no speculation while B or more sequences decode (default: never off). "
         "Draft models and EAGLE heads are not built (default: off)")
      // Read as the flags are, so a bad key fails before a model is loaded.
      ->check([](const std::string& text) -> std::string {
        const Result<engine::SpeculativeOptions> read = engine::parse_speculative_config(text);
        return read.ok() ? std::string() : read.status().message();
      });
}

}  // namespace kvvm::cli
