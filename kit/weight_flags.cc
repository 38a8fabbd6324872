#include "kit/weight_flags.h"

#include <CLI/CLI.hpp>

#include "kit/byte_size.h"
#include "kit/cli_common.h"

namespace kvvm::cli {

void add_weight_flags(CLI::App& cmd, WeightFlags& flags) {
  cmd.add_option("--weight-budget", flags.weight_budget,
                 "Device memory the weights may hold, e.g. 8GiB (default: all of them, refused "
                 "on a GPU they do not fit, naming the bytes). Below the model's size the first "
                 "and last layers and as many others as fit stay resident and the rest are "
                 "streamed from pinned host memory every step, through a ring of --ring-slots "
                 "layer slots inside the step (CUDA graphs stay on); a mixture of experts keeps "
                 "every layer's dense part resident and its experts in a cache of slots instead "
                 "(see --expert-placement). The KV cache gets what the weights leave")
      ->transform(byte_size_validator(kMaxBudgetBytes, "the most a budget may be"));
  cmd.add_option("--ring-slots", flags.ring_slots,
                 "Physical layer slots the streamed layers rotate through (default 2: one "
                 "copied while one is read; a third adds slack for a layer of memory)")
      ->transform(count_validator(2, 64));
  cmd.add_option("--expert-placement", flags.expert_placement,
                 "A mixture of experts under --weight-budget: cache (default): the dense part "
                 "resident, the experts in slots filled from host memory on a miss, the least "
                 "routed evicted (on CUDA decode graphs are then off); layers: whole layers "
                 "streamed through the ring, experts and all")
      ->check(CLI::IsMember({"cache", "layers"}));
  cmd.add_option("--load-format", flags.load_format,
                 "auto: the checkpoint's safetensors; dummy: weights drawn from a seed where "
                 "they live (no file read; config.json is enough, and a tokenizer.json where "
                 "text is encoded), so a shape larger than the disk can be served and measured")
      ->check(CLI::IsMember({"auto", "dummy"}));
}

model::WeightOptions weight_options(const WeightFlags& flags) {
  model::WeightOptions options;
  options.budget_bytes = flags.weight_budget;
  options.ring_slots = static_cast<std::uint32_t>(flags.ring_slots);
  options.expert_placement = flags.expert_placement == "layers"
                                 ? model::ExpertPlacement::kWithLayers
                                 : model::ExpertPlacement::kCache;
  options.format =
      dummy_weights(flags) ? model::LoadFormat::kDummy : model::LoadFormat::kCheckpoint;
  options.dummy_seed = flags.dummy_seed;
  return options;
}

bool dummy_weights(const WeightFlags& flags) { return flags.load_format == "dummy"; }

}  // namespace kvvm::cli
