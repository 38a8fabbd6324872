// KvSpace: the KV cache of one model, an Arena over a driver of the model's backend, with its
// handle pool and governor; the geometry comes from the model's config.
#pragma once

#include <cstdint>
#include <memory>

#include "kvvm/governor/governor.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/arena_stack.h"
#include "kvvm/kv/layout.h"
#include "kvvm/kv/prefix/prefix_cache_events.h"
#include "kvvm/model/config.h"
#include "kvvm/model/model.h"
#include "kvvm/vmm/driver.h"

namespace kvvm::engine {

// Slots beyond the sequences: the CUDA decode graphs' padding rows write to one of their own
// (KvManager::reserve_pad_slot). Added on every backend, so a space's slot count does not
// depend on where it runs; a slot nobody admits into costs addresses only.
inline constexpr std::uint32_t kPadSlots = 1;

// The KV element type when the caller does not say: the CPU model computes in fp32; the CUDA
// model in the checkpoint's 16-bit type (an F32 checkpoint runs in bf16), the one 16-bit
// type its kernels read K / V in.
DType default_kv_dtype(const model::ModelConfig& config, model::Backend backend);

struct KvSpaceOptions {
  model::Backend backend = model::Backend::kCpu;  // kCpu: the host driver; kCuda: the CUDA one
  int device = 0;                                 // CUDA device ordinal
  DType kv_dtype = DType::kUnset;  // kUnset: fp32 on CPU, the model's compute type on CUDA
  Layout layout = Layout::kTokenMajor;
  std::uint64_t host_granule = 0;  // host driver's granule in bytes; 0: its default (a page)
  // Slots of the arena, the padding slot included. Ignored when `sequences` is set.
  std::uint32_t max_slots = 8;
  // Sequences meant to run at once; non-zero: the space sizes itself, max_slots becomes
  // sequences + parked_slots + kPadSlots (and options() reports that).
  std::uint32_t sequences = 0;
  // With `sequences`: slots beyond them where ended sequences stay mapped. The next request of
  // the same prefix takes such a slot with the prefix still mapped (no map, no access change
  // for it) and budget pressure takes their private windows back first, so they cost
  // addresses only. 0: a sequence's slot is emptied for the next one as soon as all are taken.
  std::uint32_t parked_slots = 0;
  std::uint64_t max_context = 0;   // tokens per slot; 0: the config's max_position_embeddings
  std::uint64_t budget_bytes = 0;  // governor budget of the tier; 0: see device_budget_bytes
  // With budget_bytes 0: the budget the KV tier shares with the lent governor's other tiers (the
  // weights): the KV gets what they hold less of it. 0: the device's free memory (what the
  // weights already took is not free; host: 1 GiB).
  std::uint64_t device_budget_bytes = 0;
  // A driver to use instead of opening one (not owned; outlives the space): a fault-injecting
  // wrapper in tests. Its backend must be the one `backend` names.
  Driver* driver = nullptr;
  // A governor to put the KV tier under (not owned; outlives the space): the one the model's
  // weights tier lives in, so weights and KV share one device budget. Null: the space's own.
  Governor* governor = nullptr;
  // Told what the prefix cache over this space stores and removes, in blocks of
  // event_block_tokens (0: the cache's default); not owned, outlives whatever caches over the
  // space (KvManagerOptions::cache_observer, for a manager that names its own).
  PrefixCacheObserver* cache_observer = nullptr;
  std::uint64_t event_block_tokens = 0;
};

class KvSpace {
 public:
  // InvalidArgument naming the option for a geometry or context the layout cannot plan;
  // Unavailable for a CUDA backend without a device.
  static Result<std::unique_ptr<KvSpace>> create(const model::ModelConfig& config,
                                                 const KvSpaceOptions& options);
  ~KvSpace();
  KvSpace(const KvSpace&) = delete;
  KvSpace& operator=(const KvSpace&) = delete;

  Arena& arena() { return stack_->arena(); }
  KvView view() const { return stack_->arena().view(); }
  Driver& driver() { return *driver_; }
  Governor& governor() { return stack_->governor(); }
  const KvSpaceOptions& options() const { return options_; }

 private:
  KvSpace() = default;
  KvSpaceOptions options_;
  // Declaration order is teardown order reversed: the arena goes first, the driver last.
  std::unique_ptr<Driver> owned_driver_;  // null when the caller lent one (options.driver)
  Driver* driver_ = nullptr;              // the one in use, owned or lent
  std::unique_ptr<ArenaStack> stack_;
};

}  // namespace kvvm::engine
