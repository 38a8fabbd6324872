// The weight placement options `generate`, `serve` and `bench engine` share: --weight-budget,
// --ring-slots, --expert-placement and --load-format (kvvm/model/weight_memory.h says what they
// mean).
#pragma once

#include <cstdint>
#include <string>

#include "kvvm/model/weight_memory.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct WeightFlags {
  std::uint64_t weight_budget = 0;         // bytes; 0: every layer resident
  std::uint64_t ring_slots = 0;            // 0: the default (2)
  std::string expert_placement = "cache";  // cache | layers
  std::string load_format = "auto";        // auto | dummy
  std::uint64_t dummy_seed = 1;
};

void add_weight_flags(CLI::App& cmd, WeightFlags& flags);

// The model's WeightOptions (no driver or governor lent yet).
model::WeightOptions weight_options(const WeightFlags& flags);

bool dummy_weights(const WeightFlags& flags);

}  // namespace kvvm::cli
