// The MoE kernels' argument checks (include/kvvm/kernels/moe_kernels.h), in every build, CUDA or
// not, with no CUDA call: each refusal is InvalidArgument naming the bad value. Also the sizes
// the caller allocates by (moe_permuted_rows, moe_permute_scratch_bytes), which the host needs
// before any kernel runs.
#include <cstdint>
#include <string>
#include <utility>

#include "base/format.h"
#include "kvvm/kernels/moe_kernels.h"

namespace kvvm {
namespace {

// The most (token, choice) pairs one call takes: the permutation's indices and the grouped
// GEMMs' grid stay far inside 32 bits.
constexpr std::uint64_t kMaxPairs = std::uint64_t{1} << 24;

Status invalid(const char* who, const std::string& what) {
  return Status::InvalidArgument(std::string(who) + ": " + what);
}

Status check_pointer(const void* pointer, const char* name, const char* who, bool aligned) {
  if (pointer == nullptr) return invalid(who, std::string(name) + " is null");
  if (aligned && reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0) {
    return invalid(who, std::string(name) + " is not 16-byte aligned (address " +
                            hex(reinterpret_cast<std::uintptr_t>(pointer)) + ")");
  }
  return Status::Ok();
}

// Experts, top_k and the pair count every kernel shares.
Status check_routing(std::uint32_t tokens, std::uint32_t experts, std::uint32_t top_k,
                     const char* who) {
  if (experts == 0 || experts > kMoeMaxExperts) {
    return invalid(who, "experts " + str(experts) + " is not in 1 .. " + str(kMoeMaxExperts));
  }
  const std::uint32_t most = experts < kMoeMaxTopK ? experts : kMoeMaxTopK;
  if (top_k == 0 || top_k > most) {
    return invalid(who, "top_k " + str(top_k) + " is not in 1 .. " + str(most) + " (experts " +
                            str(experts) + ", at most " + str(kMoeMaxTopK) + ")");
  }
  if (std::uint64_t{tokens} * top_k > kMaxPairs) {
    return invalid(who, "tokens " + str(tokens) + " x top_k " + str(top_k) + " is over " +
                            str(kMaxPairs) + " pairs");
  }
  return Status::Ok();
}

Status check_activation_type(DType element, const char* who) {
  if (element == DType::kFp16 || element == DType::kBf16) return Status::Ok();
  return invalid(who, "element type " + std::string(to_string(element)) + " is not fp16 or bf16");
}

// hidden / inter: positive multiples of 16, of 128 for block-scaled FP8 weights.
Status check_width(std::uint32_t value, const char* name, MoeWeightFormat format, const char* who) {
  if (format != MoeWeightFormat::kNone && format != MoeWeightFormat::kFp8Block128) {
    return invalid(who, "weight format " + str(static_cast<std::uint32_t>(format)) +
                            " is not kNone or kFp8Block128");
  }
  const std::uint32_t multiple = format == MoeWeightFormat::kFp8Block128 ? 128 : 16;
  if (value == 0 || value % multiple != 0) {
    return invalid(who, std::string(name) + " " + str(value) + " is not a positive multiple of " +
                            str(multiple) +
                            (format == MoeWeightFormat::kFp8Block128 ? " (FP8 block-scaled)" : ""));
  }
  return Status::Ok();
}

}  // namespace

std::uint64_t moe_permuted_rows(std::uint32_t tokens, std::uint32_t top_k, std::uint32_t experts,
                                std::uint32_t tile) {
  const std::uint64_t pairs = std::uint64_t{tokens} * top_k;
  if (pairs == 0 || tile == 0) return pairs;
  // Each expert with a pair pads its run by at most tile - 1 rows.
  const std::uint64_t padded_experts = pairs < experts ? pairs : experts;
  return pairs + padded_experts * (tile - 1);
}

// The permutation needs no device scratch: one block sorts in shared memory.
std::uint64_t moe_permute_scratch_bytes(std::uint32_t) { return 0; }

Status check_moe_route(const MoeRouteParams& p) {
  constexpr const char* kWho = "moe_route";
  if (p.element != DType::kFp16 && p.element != DType::kBf16 && p.element != DType::kFp32) {
    return invalid(kWho, "element type " + std::string(to_string(p.element)) +
                             " of the logits is not fp16, bf16 or fp32");
  }
  KVVM_RETURN_IF_ERROR(check_routing(p.tokens, p.experts, p.top_k, kWho));
  if (p.tokens == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_pointer(p.logits, "logits", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.ids, "ids", kWho, false));
  return check_pointer(p.weights, "weights", kWho, false);
}

Status check_moe_permute(const MoePermuteParams& p) {
  constexpr const char* kWho = "moe_permute";
  KVVM_RETURN_IF_ERROR(check_routing(p.tokens, p.experts, p.top_k, kWho));
  if (p.tile == 0 || (p.tile & (p.tile - 1)) != 0 || p.tile > 1024) {
    return invalid(kWho, "tile " + str(p.tile) + " is not a power of two in 1 .. 1024");
  }
  if (p.tokens == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_pointer(p.ids, "ids", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.offsets, "offsets", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.rows, "rows", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.slot_of_pair, "slot_of_pair", kWho, false));
  return check_pointer(p.active, "active", kWho, false);
}

Status check_moe_gate_up(const MoeGateUpParams& p) {
  constexpr const char* kWho = "moe_expert_gate_up";
  KVVM_RETURN_IF_ERROR(check_activation_type(p.element, kWho));
  KVVM_RETURN_IF_ERROR(check_routing(p.tokens, p.experts, p.top_k, kWho));
  KVVM_RETURN_IF_ERROR(check_width(p.hidden, "hidden", p.format, kWho));
  KVVM_RETURN_IF_ERROR(check_width(p.inter, "inter", p.format, kWho));
  if (p.block_rows != 0 && p.block_rows != 16 && p.block_rows != 64 && p.block_rows != 128) {
    return invalid(kWho, "block_rows " + str(p.block_rows) + " is not 0, 16, 64 or 128");
  }
  if (p.tokens == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_pointer(p.x, "x", kWho, true));
  KVVM_RETURN_IF_ERROR(check_pointer(p.gate_up, "gate_up", kWho, false));
  if (p.format == MoeWeightFormat::kFp8Block128) {
    KVVM_RETURN_IF_ERROR(check_pointer(p.gate_up_scales, "gate_up_scales", kWho, false));
  }
  KVVM_RETURN_IF_ERROR(check_pointer(p.offsets, "offsets", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.rows, "rows", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.active, "active", kWho, false));
  return check_pointer(p.act, "act", kWho, true);
}

Status check_moe_down(const MoeDownParams& p) {
  constexpr const char* kWho = "moe_expert_down";
  KVVM_RETURN_IF_ERROR(check_activation_type(p.element, kWho));
  KVVM_RETURN_IF_ERROR(check_routing(p.tokens, p.experts, p.top_k, kWho));
  KVVM_RETURN_IF_ERROR(check_width(p.hidden, "hidden", p.format, kWho));
  KVVM_RETURN_IF_ERROR(check_width(p.inter, "inter", p.format, kWho));
  if (p.block_rows != 0 && p.block_rows != 16 && p.block_rows != 64 && p.block_rows != 128) {
    return invalid(kWho, "block_rows " + str(p.block_rows) + " is not 0, 16, 64 or 128");
  }
  if ((p.shared == nullptr) != (p.shared_gate == nullptr)) {
    return invalid(kWho, p.shared == nullptr ? "shared_gate given without shared"
                                             : "shared given without shared_gate");
  }
  if (p.tokens == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_pointer(p.act, "act", kWho, true));
  KVVM_RETURN_IF_ERROR(check_pointer(p.down, "down", kWho, false));
  if (p.format == MoeWeightFormat::kFp8Block128) {
    KVVM_RETURN_IF_ERROR(check_pointer(p.down_scales, "down_scales", kWho, false));
  }
  KVVM_RETURN_IF_ERROR(check_pointer(p.offsets, "offsets", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.rows, "rows", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.active, "active", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.slot_of_pair, "slot_of_pair", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.weights, "weights", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.pairs, "pairs", kWho, true));
  if (p.shared != nullptr) KVVM_RETURN_IF_ERROR(check_pointer(p.shared, "shared", kWho, true));
  return check_pointer(p.out, "out", kWho, true);
}

Status check_moe_residency(const MoeResidencyParams& p) {
  constexpr const char* kWho = "moe_residency";
  KVVM_RETURN_IF_ERROR(check_routing(p.tokens, p.experts, p.top_k, kWho));
  if (p.sparse_layers == 0 || p.layer >= p.sparse_layers) {
    return invalid(kWho,
                   "layer " + str(p.layer) + " is not below sparse_layers " + str(p.sparse_layers));
  }
  const std::uint64_t all = std::uint64_t{p.sparse_layers} * p.experts;
  // A layer's wanted experts are made resident at once, so the slots hold a whole layer's.
  if (p.slots < p.experts || p.slots > all) {
    return invalid(kWho, "slots " + str(p.slots) + " is not in experts " + str(p.experts) +
                             " .. sparse_layers x experts " + str(all));
  }
  if (all >= kMoeNoSlot) return invalid(kWho, str(all) + " experts overflow 32-bit indices");
  if (p.expert_bytes == 0 || p.expert_bytes % 16 != 0) {
    return invalid(kWho,
                   "expert_bytes " + str(p.expert_bytes) + " is not a positive multiple of 16");
  }
  if (p.decay_every == 0) return invalid(kWho, "decay_every is 0");
  for (const auto& [offset, name] :
       {std::pair{p.gate_up_offset, "gate_up_offset"}, std::pair{p.down_offset, "down_offset"},
        std::pair{p.gate_up_scale_offset, "gate_up_scale_offset"},
        std::pair{p.down_scale_offset, "down_scale_offset"}}) {
    if (offset != kMoeNoOffset && offset >= p.expert_bytes) {
      return invalid(kWho, std::string(name) + " " + str(offset) + " is past expert_bytes " +
                               str(p.expert_bytes));
    }
  }
  if (p.gate_up_offset == kMoeNoOffset || p.down_offset == kMoeNoOffset) {
    return invalid(kWho, "an expert without gate_up_offset or down_offset");
  }
  if (p.tokens == 0) return Status::Ok();
  KVVM_RETURN_IF_ERROR(check_pointer(p.ids, "ids", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.slot_of, "slot_of", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.count, "count", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.last_use, "last_use", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.holder, "holder", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.copy_list, "copy_list", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.counters, "counters", kWho, false));
  KVVM_RETURN_IF_ERROR(check_pointer(p.first_slot, "first_slot", kWho, true));
  KVVM_RETURN_IF_ERROR(check_pointer(p.staging, "staging", kWho, true));
  return check_pointer(p.tables, "tables", kWho, false);
}

}  // namespace kvvm
