// WeightStore: a model's weights at stable addresses (include/kvvm/model/weight_memory.h): one
// reservation holding the base region and a block per layer, its handles from a pool that
// charges a `weights` tier, the resident blocks committed at creation and the streamed ones
// mapped once onto a ring of slot handles. Backend-neutral: the CPU and CUDA weights fill it and
// copy into it; it owns the memory and its bookkeeping.
//
// Creation is one transaction: a failing reserve, commit or map leaves nothing behind (the
// reservation unmaps what was mapped, the pool releases what was created, the grant gives back
// what was set aside), so the tier ends at zero.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/model/weight_memory.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/reservation.h"
#include "model/weights/weight_layout.h"

namespace kvvm::model::detail {

// Every tensor's address, from the layout: what the backends' weight tables point at.
struct LayerAddresses {
  Address input_norm = 0, post_norm = 0;
  Address q_bias = 0, k_bias = 0, v_bias = 0, o_bias = 0;  // 0: the config has none
  Address q_norm = 0, k_norm = 0;                          // 0: the config has none
  Address q = 0, k = 0, v = 0, o = 0;
  Address gate_up = 0;  // [2 * intermediate][hidden]: gate rows, then up rows
  Address down = 0;
  // A sparse layer's (0 on a dense one): the router, the shared expert's gate, the shared
  // expert's gate|up and down, and expert 0's stretch (expert e's at experts + e *
  // layout().sparse.expert_stride, its tensors at layout().sparse.expert's offsets; 0 with an
  // expert cache, whose slots hold the experts instead).
  Address router = 0, shared_gate = 0, shared_gate_up = 0, shared_down = 0, experts = 0;
};
struct WeightAddresses {
  Address embed = 0, lm_head = 0, final_norm = 0;  // lm_head == embed when tied
  std::vector<LayerAddresses> layers;
};

class WeightStore {
 public:
  // `driver`: the lent one (options.driver), or null with `owned` the backend's own. The split
  // is planned from the layout, the driver's granule and options.budget_bytes. With
  // `device_free_check` (CUDA) and no budget, a model larger than the device's free memory is
  // refused naming both and suggesting a budget. Streamed layers' host copies are checked
  // against options.host_limit_bytes (else the machine's available memory) before anything is
  // reserved.
  static Result<std::unique_ptr<WeightStore>> create(Driver* driver, std::unique_ptr<Driver> owned,
                                                     const WeightLayout& layout,
                                                     const WeightOptions& options,
                                                     bool device_free_check);
  ~WeightStore();
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  const WeightSplit& split() const { return split_; }
  const WeightLayout& layout() const { return layout_; }
  Driver& driver() { return *driver_; }
  Governor& governor() { return *governor_; }
  TierId tier() const { return tier_; }

  // The base region's address; a tensor at layout offset `offset` of it.
  Address base() const;
  Address at(std::uint64_t offset) const { return base() + offset; }
  // Layer `layer`'s block: its own addresses for the model's life, whether resident or streamed.
  Address layer(std::uint32_t layer) const;
  bool streamed(std::uint32_t layer) const { return split_.streamed[layer]; }
  // The order of a streamed layer among the streamed ones (its slot is this mod ring_slots).
  std::uint32_t streamed_index(std::uint32_t layer) const { return streamed_index_[layer]; }
  // The streamed layers, in layer order.
  const std::vector<std::uint32_t>& streamed_layers() const { return streamed_order_; }
  // With an expert cache (split().expert_cache()): slot `slot`'s address, fixed for the model's
  // life, and a layer's order among the sparse layers (its experts' place in host staging).
  Address expert_slot(std::uint32_t slot) const;
  std::uint32_t sparse_index(std::uint32_t layer) const { return sparse_index_[layer]; }

  WeightAddresses addresses() const;

  // Physical bytes and handles the store's pool owns (every handle counted once, however many
  // addresses it is mapped at).
  std::uint64_t physical_bytes() const;
  std::uint64_t handles() const;

 private:
  WeightStore() = default;
  Status build(const WeightOptions& options);

  WeightLayout layout_;
  WeightSplit split_;
  std::vector<std::uint32_t> streamed_index_;
  std::vector<std::uint32_t> streamed_order_;
  std::vector<std::uint32_t> sparse_index_;
  // Construction order; teardown runs in reverse (the reservation first, the driver last).
  std::unique_ptr<Driver> owned_driver_;
  Driver* driver_ = nullptr;
  std::unique_ptr<Governor> owned_governor_;
  Governor* governor_ = nullptr;
  TierId tier_ = 0;
  std::unique_ptr<HandlePool> pool_;
  std::unique_ptr<Reservation> reservation_;
};

// Checks that `bytes` of host memory for streamed layers fit under `limit` (0: the machine's
// available memory less a margin), naming both; Ok for 0 bytes.
Status check_host_staging(std::uint64_t bytes, std::uint64_t limit);

}  // namespace kvvm::model::detail
