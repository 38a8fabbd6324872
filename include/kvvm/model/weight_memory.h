// Weights at a stable virtual address: where a model's weights live, how much of the device
// they may hold, and which layers are streamed when they do not all fit.
//
// Every weight tensor has an address inside one reservation, fixed for the model's life. Its
// physical memory comes from a handle pool charging a `weights` tier of a governor, so the
// weights and the KV cache can share one device budget (the caller lends the same governor to
// both) and every figure below is physical bytes from handle counts, never a nominal size.
//
// Resident layers are committed once at load. Layers past the budget are streamed: each keeps
// its own address range, and all of them are mapped once, for good, onto a ring of R physical
// layer slots (streamed layer s aliases slot s mod R: one handle mapped at several addresses).
// Each step copies a streamed layer's bytes from host memory (pinned on CUDA) into its range
// just before its compute; the copy into a slot waits for the last read of its previous
// occupant. On CUDA the copies and the waits are stream work, so a captured decode graph
// replays them with the ring rotating and no driver call; on the host they are the driver's
// writes, made in order.
//
// Why whole layers, first and last resident, the streamed ones spread evenly: a layer is the
// unit whose last read is one point in the step, the first streamed copy then overlaps the
// first layer's compute, and spreading the streamed layers between resident ones gives the
// copy engine compute to hide under all through the step instead of one run at its end.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/model/config.h"
#include "kvvm/model/load_progress.h"
#include "kvvm/vmm/driver.h"

namespace kvvm::model {

// A model's weight bytes in an element type, split as the store places them.
struct WeightSizes {
  // Never streamed: embedding, lm_head (when untied), final norm, every layer's norms and
  // biases; each tensor's bytes rounded up to kWeightAlignment.
  std::uint64_t base_bytes = 0;
  // One layer's projections (q, k, v, o, gate and up, down), each rounded up likewise: the
  // unit a streamed step copies.
  std::uint64_t layer_bytes = 0;
  std::uint32_t layers = 0;
  // The types they are stored in: the base region's tensors in `element`; the projections in
  // `projection` (fp8 for a quantized checkpoint kept as stored, else `element`), followed in
  // each block by their float32 scales (`layer_scale_bytes` of layer_bytes; 0 unquantized).
  DType element = DType::kUnset;
  DType projection = DType::kUnset;
  std::uint64_t layer_scale_bytes = 0;
  // Of layer_bytes, those a mixture keeps in `element` whatever the projections' type: the
  // routers and shared-expert gates (never quantized).
  std::uint64_t layer_element_bytes = 0;
  // A mixture of experts: each sparse layer's block holds `experts` experts of `expert_bytes`
  // (their projections and scales, rounded up likewise); 0 for a dense model.
  std::uint32_t sparse_layers = 0;
  std::uint32_t experts = 0;
  std::uint64_t expert_bytes = 0;
  // The experts' bytes over all layers, and what is left (the dense part: embedding, attention,
  // routers, dense MLPs, shared experts).
  std::uint64_t expert_total() const {
    return std::uint64_t{sparse_layers} * experts * expert_bytes;
  }
  std::uint64_t dense_total() const { return total() - expert_total(); }
  // One layer block's bytes before its experts (the whole block for a dense model): what stays
  // resident of every layer when the experts are cached.
  std::uint64_t dense_layer_bytes() const {
    return layer_bytes - std::uint64_t{experts} * expert_bytes;
  }
  // base_bytes + layers * layer_bytes.
  std::uint64_t total() const { return base_bytes + std::uint64_t{layers} * layer_bytes; }
  // total() by the type it is stored in, largest first: {"bf16", bytes}, {"fp8", bytes},
  // {"fp32", bytes} (the FP8 projections' scales); one entry unquantized.
  std::vector<std::pair<std::string, std::uint64_t>> bytes_by_type() const;
  // "bf16 1.2 GiB, fp8 7.2 GiB, fp32 3.5 MiB" (the same, for logs).
  std::string describe_types() const;
  // A mixture's "experts 56.6 GiB (48 layers x 128 x 9 MiB), dense part 3.1 GiB"; empty for a
  // dense model.
  std::string describe_experts() const;
};

// Every tensor starts at a multiple of this inside its region (what cuBLAS and vector loads
// want).
inline constexpr std::uint64_t kWeightAlignment = 256;

// The sizes of `config`'s weights stored in `element` (fp32 on the CPU backend, the compute
// type on CUDA), the projections of a quantized checkpoint as projection_element says.
WeightSizes weight_sizes(const ModelConfig& config, DType element);

// The element a backend computing in `element` keeps the projections in: fp8 as stored when
// the checkpoint is quantized and `element` is a 16-bit type (the CUDA backend's GEMMs read
// FP8); `element` otherwise (the CPU backend dequantizes to float32 at load).
DType projection_element(const ModelConfig& config, DType element);

// Which layers are resident and which streamed, and what that costs, for a budget.
struct WeightSplit {
  WeightSizes sizes;
  std::uint64_t granule = 0;
  std::uint64_t base_region = 0;  // base_bytes rounded up to the granule
  std::uint64_t layer_block = 0;  // layer_bytes rounded up to the granule
  std::vector<bool> streamed;     // per layer
  std::uint32_t streamed_layers = 0;
  std::uint32_t ring_slots = 0;  // 0 when nothing is streamed
  // Physical bytes: the base region, the resident layers' blocks and the ring's slots.
  std::uint64_t device_bytes = 0;
  std::uint64_t resident_layer_bytes = 0;     // resident layers' blocks
  std::uint64_t ring_bytes = 0;               // ring_slots * layer_block
  std::uint64_t streamed_bytes_per_step = 0;  // streamed_layers * layer_bytes
  std::uint64_t host_staging_bytes = 0;       // streamed_layers * layer_bytes, in host memory
  // A mixture's expert cache (0 slots when off): every layer's dense part resident, the experts
  // staged in host memory and copied on a miss into `expert_slots` slots of
  // sizes.expert_bytes at fixed addresses (a region after the layer blocks, `expert_region`
  // bytes), of the sizes.sparse_layers * sizes.experts experts there are.
  std::uint32_t expert_slots = 0;
  std::uint64_t expert_region = 0;
  bool expert_cache() const { return expert_slots > 0; }
  // Where device_bytes are: host memory for a host driver's store (the CPU backend), the device
  // otherwise (CUDA, and `kvvm plan`, which sizes a GPU).
  bool in_host_memory = false;
  // One line for start-up logs and `kvvm plan`: resident and streamed layers, R, the bytes,
  // and the bytes by the type they are stored in.
  std::string describe() const;
};

// Ring slots when the caller does not choose: two is double buffering (one slot copied while
// the other is read); a third slot adds slack at no copy cost but a layer of memory.
inline constexpr std::uint32_t kDefaultRingSlots = 2;

// How a mixture of experts is split under a budget that does not hold it.
enum class ExpertPlacement : std::uint8_t {
  kCache,       // the experts in a residency cache, every layer's dense part resident
  kWithLayers,  // the experts inside their layers' blocks, whole layers streamed
};

// budget_bytes 0: every layer resident. Otherwise, for a dense model (or a mixture with
// kWithLayers), the most layers that fit in the budget beside the base region and `ring_slots`
// (0: kDefaultRingSlots) slots stay resident, the first and the last always among them, and the
// rest are streamed, spread evenly between them; for a mixture with kCache, the base region and
// every layer's dense part stay resident and what is left holds expert slots, at least
// `least_slots` (the config's top k, one token's experts of a layer, where a layer runs its
// experts in waves; its experts per layer where a backend takes a layer's at once). A budget
// that holds everything streams nothing. InvalidArgument naming the budget and the least it
// could be when that minimum does not fit, or for a granule of 0.
Result<WeightSplit> plan_weight_split(const WeightSizes& sizes, std::uint64_t granule,
                                      std::uint64_t budget_bytes, std::uint32_t ring_slots = 0,
                                      ExpertPlacement placement = ExpertPlacement::kWithLayers,
                                      std::uint32_t least_slots = 1);

// The budget that caches a mixture's experts in exactly `slots` slots (tests, and the figures
// that sweep it). REQUIRES a mixture and 0 < slots < sizes.sparse_layers * sizes.experts.
std::uint64_t expert_cache_budget_for(const WeightSizes& sizes, std::uint64_t granule,
                                      std::uint32_t slots);

// The budget that streams exactly `streamed` of the layers (tests, and the figures that
// sweep it). REQUIRES streamed <= layers - 2 and, when streamed > 0, ring_slots < streamed.
std::uint64_t weight_budget_for(const WeightSizes& sizes, std::uint64_t granule,
                                std::uint32_t streamed, std::uint32_t ring_slots);

// Where the weights come from.
enum class LoadFormat : std::uint8_t {
  kCheckpoint,  // the ModelWeights handed to make_*_model
  kDummy,       // drawn from `dummy_seed` where they live (the device on CUDA): no file is read,
                // so a shape larger than the disk can be served and measured
};

struct WeightOptions {
  // The driver and governor the weights' reservation and handles come from (not owned; they
  // outlive the model). Null: the model opens a driver of its backend and a governor of its
  // own (then the weights share no budget with anything).
  Driver* driver = nullptr;
  Governor* governor = nullptr;  // required with `driver`
  // Physical bytes the weights may hold on the device (the weights tier's limit is what the
  // split needs, never more than this); 0: every layer resident, refused on CUDA when that
  // exceeds the device's free memory (the error names the bytes and suggests a budget).
  std::uint64_t budget_bytes = 0;
  std::uint32_t ring_slots = 0;  // 0: kDefaultRingSlots
  // A mixture under a budget that does not hold it: its experts cached (the CPU backend) or
  // streamed with their layers.
  ExpertPlacement expert_placement = ExpertPlacement::kCache;
  // Host memory the streamed layers may pin; 0: what the machine has available (read before
  // the first byte is), less a margin.
  std::uint64_t host_limit_bytes = 0;
  LoadFormat format = LoadFormat::kCheckpoint;
  std::uint64_t dummy_seed = 0;
  // Told how the checkpoint's load goes (load_progress.h); empty: nothing is told.
  LoadProgressCallback on_progress;
};

// A mixture's expert cache, from its own counts (all 0 when there is none). A lookup is one
// expert of one layer wanted by a step (however many of its rows); a miss copies the expert's
// bytes from host memory into a slot, evicting the slot's expert with the least routing
// frequency measured.
struct ExpertCacheStats {
  std::uint32_t slots = 0;
  std::uint64_t experts = 0;  // sparse layers x experts per layer
  std::uint64_t lookups = 0;
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t bytes_copied = 0;  // by misses (the slots' first fill at load is not counted)
  double copy_seconds = 0;         // the steps' time spent waiting on those copies
  double hit_rate() const { return lookups == 0 ? 0.0 : static_cast<double>(hits) / lookups; }
  // "expert cache: 29 slots for 40 experts, hit rate 74.3% (812 of 1093 lookups), 26.3 MiB
  // copied (1.3 MiB per token over 20 tokens), 4.1 ms waiting on copies" (tokens 0: no per-token
  // figure).
  std::string describe(std::uint64_t tokens) const;
};

// What the weights hold, from the store's own counts.
struct WeightStats {
  WeightSplit split;
  std::uint64_t physical_bytes = 0;  // handles the store owns x their sizes (== the tier's used)
  std::uint64_t handles = 0;
  std::uint64_t layer_copies = 0;  // streamed layers copied so far (eager steps; a graph's
                                   // replays copy without the host seeing them)
  std::uint64_t load_bytes = 0;    // bytes written at load (device and host staging)
  double load_seconds = 0;         // from the first byte read to the last written
  ExpertCacheStats experts;
};

}  // namespace kvvm::model
