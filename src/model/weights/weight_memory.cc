// The weights' layout (every tensor's offset in its region), their sizes, and the split of a
// budget into resident and streamed layers.
#include "kvvm/model/weight_memory.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "kvvm/base/bytes.h"
#include "model/weights/weight_layout.h"

namespace kvvm::model {
namespace {

std::uint64_t round_up(std::uint64_t value, std::uint64_t to) { return (value + to - 1) / to * to; }

// Appends a tensor of `elements` to a region whose end is `end`; returns its offset.
std::uint64_t place(std::uint64_t& end, std::uint64_t elements, std::uint32_t element_size) {
  const std::uint64_t at = end;
  end += round_up(elements * element_size, kWeightAlignment);
  return at;
}

std::string layer_count(std::uint32_t n) {
  return std::to_string(n) + (n == 1 ? " layer" : " layers");
}

}  // namespace

namespace detail {

std::uint64_t weight_scale_count(WeightQuant quant, std::uint64_t rows, std::uint64_t in) {
  switch (quant) {
    case WeightQuant::kFp8Block:
      return ((rows + kFp8WeightBlock - 1) / kFp8WeightBlock) *
             ((in + kFp8WeightBlock - 1) / kFp8WeightBlock);
    case WeightQuant::kFp8Channel:
      return rows;
    case WeightQuant::kNone:
      break;
  }
  return 0;
}

std::uint64_t device_scale_row(std::uint64_t in) {
  return ((in + kFp8WeightBlock - 1) / kFp8WeightBlock + 3) / 4 * 4;
}

std::uint64_t device_scale_count(WeightQuant quant, std::uint64_t rows, std::uint64_t in) {
  if (quant != WeightQuant::kFp8Block) return weight_scale_count(quant, rows, in);
  return (rows + kFp8WeightBlock - 1) / kFp8WeightBlock * device_scale_row(in);
}

namespace {

// An expert's stretch (or the shared expert's, placed at `end`): gate|up, down, then their scales.
ExpertOffsets place_expert(std::uint64_t& end, const ModelConfig& c, std::uint64_t inter,
                           std::uint32_t psize, bool scales) {
  const std::uint64_t hidden = c.hidden_size;
  ExpertOffsets out;
  out.gate_up = place(end, 2 * inter * hidden, psize);
  out.down = place(end, hidden * inter, psize);
  if (scales) {
    out.gate_up_scale = place(end, 2 * device_scale_count(c.weight_quant, inter, hidden), 4);
    out.down_scale = place(end, device_scale_count(c.weight_quant, hidden, inter), 4);
  }
  return out;
}

}  // namespace

WeightLayout weight_layout(const ModelConfig& c, DType element) {
  const std::uint32_t size = element_bytes(element);
  const std::uint64_t hidden = c.hidden_size;
  // A mixture whose layers are all sparse has no dense MLP to place.
  const std::uint64_t inter =
      c.moe.sparse_layers() == c.layers && c.moe.enabled() ? 0 : c.intermediate_size;
  const std::uint64_t q_dim = std::uint64_t{c.heads} * c.head_dim;
  const std::uint64_t kv_dim = std::uint64_t{c.kv_heads} * c.head_dim;
  WeightLayout layout;
  layout.element = element;
  std::uint64_t base = 0;
  layout.embed = place(base, std::uint64_t{c.vocab_size} * hidden, size);
  layout.lm_head = c.tie_word_embeddings ? layout.embed
                                         : place(base, std::uint64_t{c.vocab_size} * hidden, size);
  layout.final_norm = place(base, hidden, size);
  layout.layers.resize(c.layers);
  for (LayerBaseOffsets& layer : layout.layers) {
    layer.input_norm = place(base, hidden, size);
    layer.post_norm = place(base, hidden, size);
    if (c.qkv_bias) {
      // One run, as the weights below: the fused q|k|v projection adds them in one pass.
      layer.q_bias = place(base, q_dim + 2 * kv_dim, size);
      layer.k_bias = layer.q_bias + q_dim * size;
      layer.v_bias = layer.k_bias + kv_dim * size;
    }
    if (c.o_bias) layer.o_bias = place(base, hidden, size);
    if (c.qk_norm) {
      layer.q_norm = place(base, c.head_dim, size);
      layer.k_norm = place(base, c.head_dim, size);
    }
  }
  if (c.moe.enabled()) {
    layout.expert_tables = place(base, 4ull * c.moe.experts * c.moe.sparse_layers(), 8);
  }
  layout.projection = projection_element(c, element);
  const std::uint32_t psize = element_bytes(layout.projection);
  std::uint64_t block = 0;
  // q, k and v back to back: one [q_dim + 2 * kv_dim][hidden] matrix, the fused projection.
  layout.block.q = place(block, (q_dim + 2 * kv_dim) * hidden, psize);
  layout.block.k = layout.block.q + q_dim * hidden * psize;
  layout.block.v = layout.block.k + kv_dim * hidden * psize;
  layout.block.o = place(block, hidden * q_dim, psize);
  layout.block.gate_up = place(block, 2 * inter * hidden, psize);
  layout.block.down = place(block, hidden * inter, psize);
  std::uint64_t scale_bytes = 0;
  if (layout.projection != element) {
    const std::uint64_t projections = block;
    const WeightQuant quant = c.weight_quant;
    layout.block.qkv_scale = place(
        block,
        device_scale_count(quant, q_dim, hidden) + 2 * device_scale_count(quant, kv_dim, hidden),
        4);
    layout.block.o_scale = place(block, device_scale_count(quant, hidden, q_dim), 4);
    layout.block.gate_up_scale = place(block, 2 * device_scale_count(quant, inter, hidden), 4);
    layout.block.down_scale = place(block, device_scale_count(quant, hidden, inter), 4);
    scale_bytes = block - projections;
  }
  std::uint64_t expert_scale_bytes = 0;
  std::uint64_t element_bytes_in_block = 0;  // the router's and the shared expert's gate
  if (c.moe.enabled()) {
    layout.least_expert_slots = c.moe.top_k;
    layout.sparse_layer.resize(c.layers);
    for (std::uint32_t l = 0; l < c.layers; ++l) layout.sparse_layer[l] = c.moe.sparse_layer(l);
    const bool scales = layout.projection != element;
    SparseOffsets& sparse = layout.sparse;
    sparse.router = place(block, std::uint64_t{c.moe.experts} * hidden, size);
    if (c.moe.shared_intermediate > 0) {
      sparse.shared_gate = place(block, hidden, size);
      sparse.shared = place_expert(block, c, c.moe.shared_intermediate, psize, scales);
      if (scales) scale_bytes += block - sparse.shared.gate_up_scale;
    }
    sparse.experts = block;
    std::uint64_t stride = 0;
    sparse.expert = place_expert(stride, c, c.moe.expert_intermediate, psize, scales);
    sparse.expert_stride = stride;
    if (scales) expert_scale_bytes = stride - sparse.expert.gate_up_scale;
    block += stride * c.moe.experts;
    scale_bytes += expert_scale_bytes * c.moe.experts;
    element_bytes_in_block =
        (sparse.shared_gate == kNoTensor ? sparse.experts : sparse.shared.gate_up) - sparse.router;
  }
  layout.sizes = WeightSizes{.base_bytes = base,
                             .layer_bytes = block,
                             .layers = c.layers,
                             .element = element,
                             .projection = layout.projection,
                             .layer_scale_bytes = scale_bytes,
                             .layer_element_bytes = element_bytes_in_block,
                             .sparse_layers = c.moe.sparse_layers(),
                             .experts = c.moe.experts,
                             .expert_bytes = layout.sparse.expert_stride};
  return layout;
}

}  // namespace detail

DType projection_element(const ModelConfig& config, DType element) {
  const bool sixteen_bit = element == DType::kBf16 || element == DType::kFp16;
  return config.weight_quant != WeightQuant::kNone && sixteen_bit ? DType::kFp8 : element;
}

WeightSizes weight_sizes(const ModelConfig& config, DType element) {
  return detail::weight_layout(config, element).sizes;
}

namespace {

// Every layer's dense part resident and the experts cached in what the budget leaves
// (`split` holds the sizes, granule and base region; the budget is below everything).
Result<WeightSplit> plan_expert_cache(WeightSplit split, std::uint64_t everything,
                                      std::uint64_t budget_bytes, std::uint32_t least_slots) {
  const WeightSizes& sizes = split.sizes;
  const std::uint64_t granule = split.granule;
  const std::uint32_t n = sizes.layers;
  split.layer_block = round_up(sizes.dense_layer_bytes(), granule);
  const std::uint64_t fixed = split.base_region + std::uint64_t{n} * split.layer_block;
  const std::uint64_t fewest =
      std::clamp<std::uint64_t>(least_slots, 1, std::uint64_t{sizes.sparse_layers} * sizes.experts);
  const std::uint64_t least = fixed + round_up(fewest * sizes.expert_bytes, granule);
  if (budget_bytes < least) {
    return Status::InvalidArgument(
        "weight budget " + format_bytes(budget_bytes) + " is below the " +
        format_bytes(everything) + " every weight needs, and caching the experts needs at least " +
        format_bytes(least) + " (the embeddings and norms " + format_bytes(split.base_region) +
        ", every layer's dense part " + format_bytes(std::uint64_t{n} * split.layer_block) +
        " and " + std::to_string(fewest) + " expert slots of " + format_bytes(sizes.expert_bytes) +
        (fewest == sizes.experts ? ", every expert of a layer)"
                                 : ", one token's experts of a layer)"));
  }
  const std::uint64_t cached = std::uint64_t{sizes.sparse_layers} * sizes.experts;
  const std::uint64_t room = (budget_bytes - fixed) / granule * granule;
  const std::uint64_t slots = std::min(cached, room / sizes.expert_bytes);
  split.expert_slots = static_cast<std::uint32_t>(slots);
  split.expert_region = round_up(slots * sizes.expert_bytes, granule);
  split.resident_layer_bytes = std::uint64_t{n} * split.layer_block;
  split.host_staging_bytes = sizes.expert_total();
  split.device_bytes = fixed + split.expert_region;
  return split;
}

}  // namespace

Result<WeightSplit> plan_weight_split(const WeightSizes& sizes, std::uint64_t granule,
                                      std::uint64_t budget_bytes, std::uint32_t ring_slots,
                                      ExpertPlacement placement, std::uint32_t least_slots) {
  if (granule == 0) return Status::InvalidArgument("weight split: a granule of 0 bytes");
  WeightSplit split;
  split.sizes = sizes;
  split.granule = granule;
  split.base_region = round_up(sizes.base_bytes, granule);
  split.layer_block = round_up(sizes.layer_bytes, granule);
  const std::uint32_t n = sizes.layers;
  split.streamed.assign(n, false);
  const std::uint64_t everything = split.base_region + std::uint64_t{n} * split.layer_block;
  if (budget_bytes == 0 || budget_bytes >= everything) {
    split.device_bytes = everything;
    split.resident_layer_bytes = std::uint64_t{n} * split.layer_block;
    return split;
  }
  if (placement == ExpertPlacement::kCache && sizes.experts > 0 && sizes.sparse_layers > 0) {
    return plan_expert_cache(std::move(split), everything, budget_bytes, least_slots);
  }
  const std::uint32_t ring = ring_slots == 0 ? kDefaultRingSlots : ring_slots;
  if (ring < 2) {
    return Status::InvalidArgument("ring slots " + std::to_string(ring) +
                                   ": streaming needs at least 2 (one copied while one is read)");
  }
  // The first and last layers stay resident and more layers than slots must stream, or the
  // ring would only cost memory.
  const std::uint64_t least = split.base_region + (2 + std::uint64_t{ring}) * split.layer_block;
  if (std::uint64_t{n} < 3 + std::uint64_t{ring} || budget_bytes < least) {
    const std::string why =
        std::uint64_t{n} < 3 + std::uint64_t{ring}
            ? "the model's " + layer_count(n) + " are too few to stream through " +
                  std::to_string(ring) + " ring slots (the first and last stay resident)"
            : "streaming needs at least " + format_bytes(least) + " (the embeddings and norms " +
                  format_bytes(split.base_region) + ", the first and last layers and " +
                  std::to_string(ring) + " ring slots of " + format_bytes(split.layer_block) + ")";
    return Status::InvalidArgument("weight budget " + format_bytes(budget_bytes) +
                                   " is below the " + format_bytes(everything) +
                                   " every weight needs, and " + why);
  }
  const std::uint64_t slots_in_budget = (budget_bytes - split.base_region) / split.layer_block;
  const auto resident = static_cast<std::uint32_t>(slots_in_budget - ring);  // >= 2, < n - ring
  const std::uint32_t streamed = n - resident;
  const std::uint32_t middle = n - 2;
  // The j-th streamed layer sits at the middle of the j-th of `streamed` equal spans of the
  // layers between the first and the last.
  for (std::uint32_t j = 0; j < streamed; ++j) {
    const std::uint64_t at = (2 * std::uint64_t{j} + 1) * middle / (2 * std::uint64_t{streamed});
    split.streamed[1 + at] = true;
  }
  split.streamed_layers = streamed;
  split.ring_slots = ring;
  split.resident_layer_bytes = std::uint64_t{resident} * split.layer_block;
  split.ring_bytes = std::uint64_t{ring} * split.layer_block;
  split.streamed_bytes_per_step = std::uint64_t{streamed} * sizes.layer_bytes;
  split.host_staging_bytes = split.streamed_bytes_per_step;
  split.device_bytes = split.base_region + split.resident_layer_bytes + split.ring_bytes;
  return split;
}

std::uint64_t weight_budget_for(const WeightSizes& sizes, std::uint64_t granule,
                                std::uint32_t streamed, std::uint32_t ring_slots) {
  const std::uint32_t ring = streamed == 0 ? 0 : (ring_slots == 0 ? kDefaultRingSlots : ring_slots);
  return round_up(sizes.base_bytes, granule) +
         (std::uint64_t{sizes.layers} - streamed + ring) * round_up(sizes.layer_bytes, granule);
}

std::uint64_t expert_cache_budget_for(const WeightSizes& sizes, std::uint64_t granule,
                                      std::uint32_t slots) {
  return round_up(sizes.base_bytes, granule) +
         std::uint64_t{sizes.layers} * round_up(sizes.dense_layer_bytes(), granule) +
         round_up(std::uint64_t{slots} * sizes.expert_bytes, granule);
}

std::vector<std::pair<std::string, std::uint64_t>> WeightSizes::bytes_by_type() const {
  const std::uint64_t n = layers;
  std::vector<std::pair<std::string, std::uint64_t>> out;
  auto add = [&out](DType type, std::uint64_t bytes) {
    if (bytes == 0) return;
    const std::string name(to_string(type));
    for (auto& [have, sum] : out) {
      if (have == name) {
        sum += bytes;
        return;
      }
    }
    out.emplace_back(name, bytes);
  };
  add(element, base_bytes);
  add(projection == DType::kUnset ? element : projection,
      n * (layer_bytes - layer_scale_bytes - layer_element_bytes));
  add(element, n * layer_element_bytes);
  add(DType::kFp32, n * layer_scale_bytes);
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::string WeightSizes::describe_types() const {
  std::string out;
  for (const auto& [type, bytes] : bytes_by_type()) {
    out += (out.empty() ? "" : ", ") + type + " " + format_bytes(bytes);
  }
  return out;
}

std::string WeightSizes::describe_experts() const {
  if (experts == 0) return "";
  return "experts " + format_bytes(expert_total()) + " (" + layer_count(sparse_layers) + " x " +
         std::to_string(experts) + " x " + format_bytes(expert_bytes) + "), dense part " +
         format_bytes(dense_total());
}

std::string ExpertCacheStats::describe(std::uint64_t tokens) const {
  char rate[32];
  std::snprintf(rate, sizeof rate, "%.1f%%", 100.0 * hit_rate());
  std::string out = "expert cache: " + std::to_string(slots) + " slots for " +
                    std::to_string(experts) + " experts, hit rate " + rate + " (" +
                    std::to_string(hits) + " of " + std::to_string(lookups) + " lookups), " +
                    format_bytes(bytes_copied) + " copied";
  if (tokens > 0) {
    out += " (" + format_bytes(bytes_copied / tokens) + " per token over " +
           std::to_string(tokens) + (tokens == 1 ? " token)" : " tokens)");
  }
  char wait[32];
  std::snprintf(wait, sizeof wait, "%.1f ms", copy_seconds * 1e3);
  return out + ", " + wait + " waiting on copies";
}

std::string WeightSplit::describe() const {
  const std::uint32_t n = sizes.layers;
  const std::string experts = sizes.describe_experts();
  const std::string types =
      " [" + sizes.describe_types() + (experts.empty() ? "" : "; " + experts) + "]";
  const std::string where = in_host_memory ? " in host memory" : " on the device";
  if (expert_cache()) {
    const std::uint64_t cached = std::uint64_t{sizes.sparse_layers} * sizes.experts;
    return "weights: " + format_bytes(device_bytes) + where + " (every layer's dense part " +
           "resident, an expert cache of " + std::to_string(expert_slots) + " slots of " +
           format_bytes(sizes.expert_bytes) + " for " + std::to_string(cached) + " experts); " +
           format_bytes(host_staging_bytes) + " of experts in host memory, copied on a miss" +
           types;
  }
  if (streamed_layers == 0) {
    return "weights: " + format_bytes(device_bytes) + where + ", all " + layer_count(n) +
           " resident" + types;
  }
  return "weights: " + format_bytes(device_bytes) + where + " (" +
         std::to_string(n - streamed_layers) + " of " + layer_count(n) + " resident, a ring of " +
         std::to_string(ring_slots) + " slots of " + format_bytes(layer_block) + "); " +
         layer_count(streamed_layers) + " streamed from host memory, " +
         format_bytes(streamed_bytes_per_step) + " copied per step" + types;
}

}  // namespace kvvm::model
