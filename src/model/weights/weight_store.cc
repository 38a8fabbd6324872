// WeightStore: the reservation, pool and tier under a model's weights, and the ring of slots
// its streamed layers alias.
#include "model/weights/weight_store.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "kvvm/base/bytes.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::model::detail {
namespace {

// Resident memory is committed in handles of this size (fewer driver calls than one per
// granule; nothing of it is ever shared in parts).
constexpr std::uint64_t kResidentHandleBytes = std::uint64_t{64} << 20;

std::uint64_t round_up(std::uint64_t value, std::uint64_t to) { return (value + to - 1) / to * to; }

}  // namespace

Status check_host_staging(std::uint64_t bytes, std::uint64_t limit) {
  if (bytes == 0) return Status::Ok();
  std::string whose = "the host memory limit";
  if (limit == 0) {
    // Leave the system room to work: a tenth of what is available, at least 1 GiB.
    const std::uint64_t available = host_available_bytes();
    const std::uint64_t margin = std::max<std::uint64_t>(available / 10, std::uint64_t{1} << 30);
    limit = available > margin ? available - margin : 0;
    whose = "the machine's available memory (" + format_bytes(available) + ") less a margin";
  }
  if (bytes > limit) {
    return Status::ResourceExhausted(
        "the streamed layers need " + format_bytes(bytes) + " of host memory and " + whose +
            " is " + format_bytes(limit) + ": give a larger weight budget (fewer layers streamed)",
        Exhaustion{bytes, limit, limit});
  }
  return Status::Ok();
}

Result<std::unique_ptr<WeightStore>> WeightStore::create(Driver* driver,
                                                         std::unique_ptr<Driver> owned,
                                                         const WeightLayout& layout,
                                                         const WeightOptions& options,
                                                         bool device_free_check) {
  std::unique_ptr<WeightStore> store(new WeightStore());
  store->owned_driver_ = std::move(owned);
  store->driver_ = driver != nullptr ? driver : store->owned_driver_.get();
  if (store->driver_ == nullptr) return Status::InvalidArgument("weights: no driver");
  if (options.driver != nullptr && options.governor == nullptr) {
    return Status::InvalidArgument("weights: a lent driver needs the governor it budgets under");
  }
  store->layout_ = layout;
  Result<WeightSplit> split =
      plan_weight_split(layout.sizes, store->driver_->granule(), options.budget_bytes,
                        options.ring_slots, options.expert_placement, layout.least_expert_slots);
  if (!split.ok()) return split.status().with_context("--weight-budget");
  store->split_ = std::move(split).value();
  store->split_.in_host_memory = store->driver_->info().backend == "host";
  const WeightSplit& s = store->split_;
  if (device_free_check && options.budget_bytes == 0) {
    const std::uint64_t free = store->driver_->info().free_bytes;
    if (s.device_bytes > free) {
      return Status::ResourceExhausted(
          "the weights need " + format_bytes(s.device_bytes) + " on the device and it has " +
              format_bytes(free) + " free: give --weight-budget SIZE (below " + format_bytes(free) +
              ", leaving room for the KV cache) to stream layers from " + "host memory",
          Exhaustion{s.device_bytes, free, store->driver_->info().total_bytes});
    }
  }
  KVVM_RETURN_IF_ERROR(check_host_staging(s.host_staging_bytes, options.host_limit_bytes));
  KVVM_RETURN_IF_ERROR(store->build(options));
  return store;
}

Status WeightStore::build(const WeightOptions& options) {
  const WeightSplit& s = split_;
  const std::uint32_t n = s.sizes.layers;
  streamed_index_.assign(n, 0);
  sparse_index_.assign(n, 0);
  std::uint32_t sparse = 0;
  for (std::uint32_t l = 0; l < n; ++l) {
    sparse_index_[l] = sparse;
    if (l < layout_.sparse_layer.size() && layout_.sparse_layer[l]) ++sparse;
  }
  for (std::uint32_t l = 0; l < n; ++l) {
    if (!s.streamed[l]) continue;
    streamed_index_[l] = static_cast<std::uint32_t>(streamed_order_.size());
    streamed_order_.push_back(l);
  }
  if (options.governor != nullptr) {
    governor_ = options.governor;
  } else {
    owned_governor_ = std::make_unique<Governor>();
    governor_ = owned_governor_.get();
  }
  tier_ = governor_->add_tier("weights", s.device_bytes);
  // Nothing is pooled: a weight handle given back is released at once, so the tier returns to
  // zero when the store goes.
  pool_ =
      std::make_unique<HandlePool>(*driver_, PoolOptions{.max_pooled_bytes = 0}, governor_, tier_);
  Result<std::unique_ptr<Reservation>> reserved = Reservation::create(
      *pool_, s.base_region + std::uint64_t{n} * s.layer_block + s.expert_region);
  if (!reserved.ok()) return reserved.status().with_context("weights");
  reservation_ = std::move(reserved).value();

  Result<Grant> grant = governor_->prepare(tier_, s.device_bytes);
  if (!grant.ok()) return grant.status().with_context("weights");
  std::vector<Range> resident{Range{0, s.base_region}};
  std::vector<Range> slots;
  for (std::uint32_t l = 0; l < n; ++l) {
    const Range block{s.base_region + std::uint64_t{l} * s.layer_block, s.layer_block};
    if (!s.streamed[l]) {
      resident.push_back(block);
    } else if (streamed_index_[l] < s.ring_slots) {
      slots.push_back(block);
    }
  }
  if (s.expert_region > 0) {
    resident.push_back(Range{s.base_region + std::uint64_t{n} * s.layer_block, s.expert_region});
  }
  const std::uint64_t granule = s.granule;
  KVVM_RETURN_IF_ERROR(reservation_->commit_ranges(
      resident, &*grant,
      CommitOptions{.access = Access::kReadWrite,
                    .handle_bytes = round_up(kResidentHandleBytes, granule)}));
  if (!slots.empty()) {
    // One handle per slot: the CUDA driver maps whole handles only.
    KVVM_RETURN_IF_ERROR(reservation_->commit_ranges(
        slots, &*grant,
        CommitOptions{.access = Access::kReadWrite, .handle_bytes = s.layer_block}));
  }
  for (std::uint32_t index = s.ring_slots; index < streamed_order_.size(); ++index) {
    const std::uint32_t owner = streamed_order_[index % s.ring_slots];
    const Block* slot = reservation_->block_at(layer(owner) - base());
    if (slot == nullptr)
      return Status::Internal("weights: ring slot of layer " + std::to_string(owner));
    Result<HandleInfo> info = pool_->describe(slot->handle);
    if (!info.ok()) return info.status().with_context("weights: ring slot");
    KVVM_RETURN_IF_ERROR(reservation_->map_shared(layer(streamed_order_[index]) - base(), *info,
                                                  Access::kReadWrite));
  }
  grant->commit_charged();
  return Status::Ok();
}

WeightStore::~WeightStore() {
  reservation_.reset();
  pool_.reset();
}

Address WeightStore::base() const { return reservation_->base(); }

Address WeightStore::layer(std::uint32_t layer) const {
  return base() + split_.base_region + std::uint64_t{layer} * split_.layer_block;
}

Address WeightStore::expert_slot(std::uint32_t slot) const {
  return base() + split_.base_region + std::uint64_t{split_.sizes.layers} * split_.layer_block +
         std::uint64_t{slot} * split_.sizes.expert_bytes;
}

WeightAddresses WeightStore::addresses() const {
  WeightAddresses out;
  out.embed = at(layout_.embed);
  out.lm_head = at(layout_.lm_head);
  out.final_norm = at(layout_.final_norm);
  auto optional = [&](std::uint64_t offset) { return offset == kNoTensor ? 0 : at(offset); };
  const LayerBlockOffsets& k = layout_.block;
  for (std::uint32_t l = 0; l < layout_.layers.size(); ++l) {
    const LayerBaseOffsets& b = layout_.layers[l];
    const Address block = layer(l);
    out.layers.push_back(LayerAddresses{.input_norm = at(b.input_norm),
                                        .post_norm = at(b.post_norm),
                                        .q_bias = optional(b.q_bias),
                                        .k_bias = optional(b.k_bias),
                                        .v_bias = optional(b.v_bias),
                                        .o_bias = optional(b.o_bias),
                                        .q_norm = optional(b.q_norm),
                                        .k_norm = optional(b.k_norm),
                                        .q = block + k.q,
                                        .k = block + k.k,
                                        .v = block + k.v,
                                        .o = block + k.o,
                                        .gate_up = block + k.gate_up,
                                        .down = block + k.down});
    const SparseOffsets& sparse = layout_.sparse;
    if (l < layout_.sparse_layer.size() && layout_.sparse_layer[l]) {
      LayerAddresses& a = out.layers.back();
      a.router = block + sparse.router;
      if (sparse.shared_gate != kNoTensor) {
        a.shared_gate = block + sparse.shared_gate;
        a.shared_gate_up = block + sparse.shared.gate_up;
        a.shared_down = block + sparse.shared.down;
      }
      a.experts = split_.expert_cache() ? 0 : block + sparse.experts;
    }
  }
  return out;
}

std::uint64_t WeightStore::physical_bytes() const { return pool_->snapshot().owned_bytes; }

std::uint64_t WeightStore::handles() const {
  const PoolSnapshot snapshot = pool_->snapshot();
  return snapshot.handles_in_use + snapshot.handles_pooled + snapshot.handles_quarantined;
}

}  // namespace kvvm::model::detail
