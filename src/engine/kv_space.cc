// KvSpace: a model's KV cache: the driver of its backend and an ArenaStack (governor tier,
// handle pool, arena) planned from the model's config.
#include "kvvm/engine/kv_space.h"

#include <chrono>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "kvvm/base/bytes.h"
#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::engine {

DType default_kv_dtype(const model::ModelConfig& config, model::Backend backend) {
  if (backend == model::Backend::kCpu) return DType::kFp32;
  return config.dtype == DType::kFp16 ? DType::kFp16 : DType::kBf16;
}

namespace {

constexpr std::uint64_t kHostBudgetBytes = std::uint64_t{1} << 30;

// A lent driver must be of the backend the model computes on: the CUDA model reads KV from
// device addresses, the CPU model from host ones.
Status check_lent_driver(const KvSpaceOptions& options) {
  const std::string backend = options.driver->info().backend;
  const std::string_view wanted = options.backend == model::Backend::kCuda ? "cuda" : "host";
  if (backend != wanted) {
    return Status::InvalidArgument("driver: a " + backend + " driver for the " +
                                   std::string(model::to_string(options.backend)) +
                                   " backend (it needs a " + std::string(wanted) + " driver)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<Driver>> open_driver(const KvSpaceOptions& options) {
  if (options.backend == model::Backend::kCuda) {
    Result<std::unique_ptr<Driver>> driver =
        make_cuda_driver(CudaDriverOptions{.device = options.device});
    if (!driver.ok()) {
      return driver.status().with_context("KV space on CUDA device " +
                                          std::to_string(options.device));
    }
    return driver;
  }
  Result<std::unique_ptr<Driver>> driver =
      make_host_driver(HostDriverOptions{.granule = options.host_granule});
  if (!driver.ok()) {
    return driver.status().with_context("host_granule " + std::to_string(options.host_granule));
  }
  return driver;
}

}  // namespace

KvSpace::~KvSpace() {
  // The stack releases through the driver: it goes first.
  stack_.reset();
  owned_driver_.reset();
}

Result<std::unique_ptr<KvSpace>> KvSpace::create(const model::ModelConfig& config,
                                                 const KvSpaceOptions& options) {
  std::unique_ptr<KvSpace> space(new KvSpace());
  space->options_ = options;
  KvSpaceOptions& o = space->options_;
  if (o.kv_dtype == DType::kUnset) o.kv_dtype = default_kv_dtype(config, o.backend);
  if (o.max_context == 0) o.max_context = config.max_position_embeddings;
  if (o.max_context == 0) {
    return Status::InvalidArgument(
        "max_context 0: neither the options nor the config (max_position_embeddings) give a "
        "context length");
  }
  if (o.sequences != 0) {
    const std::uint64_t slots = std::uint64_t{o.sequences} + o.parked_slots + kPadSlots;
    if (slots > std::numeric_limits<std::uint32_t>::max()) {
      return Status::InvalidArgument("sequences " + std::to_string(o.sequences) +
                                     " and parked_slots " + std::to_string(o.parked_slots) +
                                     ": no room for the padding slot in 32-bit slot ids");
    }
    o.max_slots = static_cast<std::uint32_t>(slots);
  } else if (o.parked_slots != 0) {
    return Status::InvalidArgument("parked_slots " + std::to_string(o.parked_slots) +
                                   " without sequences: parked slots are counted beyond them");
  }
  if (o.max_slots == 0) return Status::InvalidArgument("max_slots 0: at least one slot is needed");

  if (o.driver != nullptr) {
    KVVM_RETURN_IF_ERROR(check_lent_driver(o));
    space->driver_ = o.driver;
  } else {
    KVVM_ASSIGN_OR_RETURN(std::unique_ptr<Driver> driver, open_driver(o));
    space->owned_driver_ = std::move(driver);
    space->driver_ = space->owned_driver_.get();
  }
  Driver& d = *space->driver_;

  Result<LayoutPlan> plan =
      plan_layout(config.kv_geometry(o.kv_dtype), o.layout, d.granule(), o.max_context);
  if (!plan.ok()) {
    return plan.status().with_context("KV space (layout " + std::string(to_string(o.layout)) +
                                      ", max_context " + std::to_string(o.max_context) + ")");
  }

  if (o.budget_bytes == 0 && o.device_budget_bytes != 0) {
    std::uint64_t others = 0;  // what the lent governor's tiers (the weights) hold or set aside
    if (o.governor != nullptr) {
      for (TierId tier = 0; tier < o.governor->tier_count(); ++tier) {
        const TierStats stats = o.governor->stats(tier);
        others += stats.used + stats.reserved;
      }
    }
    if (others >= o.device_budget_bytes) {
      return Status::InvalidArgument("device budget " + format_bytes(o.device_budget_bytes) +
                                     ": the weights hold " + format_bytes(others) +
                                     " of it, leaving nothing for the KV cache");
    }
    o.budget_bytes = o.device_budget_bytes - others;
  }
  if (o.budget_bytes == 0) {
    // On a GPU the free memory once the weights are loaded; the host has no such figure
    // worth trusting (overcommit), so a fixed default.
    o.budget_bytes =
        o.backend == model::Backend::kCuda ? d.info().free_bytes / 10 * 9 : kHostBudgetBytes;
  }
  Result<std::unique_ptr<ArenaStack>> stack = ArenaStack::create(
      d, ArenaStackOptions{.tier_name = std::string(model::to_string(o.backend)) + " kv",
                           .budget_bytes = o.budget_bytes,
                           .governor = o.governor,
                           .arena = ArenaOptions{.plan = *plan,
                                                 .max_slots = o.max_slots,
                                                 .commit_ahead_windows = 0,
                                                 .budget_wait = std::chrono::milliseconds(0)}});
  if (!stack.ok()) return stack.status().with_context("KV space");
  space->stack_ = std::move(stack).value();
  return space;
}

}  // namespace kvvm::engine
