// Layouts and their arithmetic (docs/ARCHITECTURE.md, "Layouts and their arithmetic").
//
// Why everything derives from (fragments, contiguous bytes per token): each fragment starts
// on a granule boundary of its slot and fills from there, so every figure here (commit floor,
// crossover, shareability, strides) is a function of those two numbers and the granule. The
// tests check the floor against a brute-force count of the windows the KvView's offsets
// touch, which ties this arithmetic to the addresses a kernel will actually read.
//
// Why unsigned 64-bit arithmetic with checked products in plan_layout only: once the slot
// stride fits in 64 bits, every later figure (n tokens <= max context, a prefix inside the
// slot) is bounded by it, so the queries need no overflow checks of their own.
#include "kvvm/kv/layout.h"

#include <string>

#include "kvvm/base/bytes.h"
#include "kvvm/base/check.h"

namespace kvvm {
namespace {

bool multiply(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

std::uint64_t ceil_div(std::uint64_t value, std::uint64_t divisor) {
  return value / divisor + (value % divisor != 0 ? 1 : 0);
}

// A LayoutPlan is a plain struct: one not made by plan_layout may hold zeros, and dividing by
// them would be undefined behaviour instead of a loud programming error.
void require_planned(const LayoutPlan& plan, const char* what) {
  KVVM_CHECK(plan.granule != 0 && plan.contiguous_bytes_per_token != 0,
             std::string(what) +
                 ": the LayoutPlan has a zero granule or zero bytes per token; make it with "
                 "plan_layout");
}

void require_in_slot(const LayoutPlan& plan, std::uint64_t tokens, const char* what) {
  KVVM_CHECK(tokens <= plan.max_context, std::string(what) + "(" + std::to_string(tokens) +
                                             " tokens): the slot holds at most " +
                                             std::to_string(plan.max_context) +
                                             " tokens (max context)");
}

std::string describe(const LayoutPlan& plan) {
  return std::string(to_string(plan.layout)) + " layout";
}

}  // namespace

std::string_view to_string(Layout layout) {
  switch (layout) {
    case Layout::kHeadMajor:
      return "head-major";
    case Layout::kSeqMajor:
      return "seq-major";
    case Layout::kTokenMajor:
      return "token-major";
  }
  return "unknown";
}

Result<Layout> parse_layout(std::string_view text) {
  if (text == "head-major" || text == "bnsh" || text == "BNSH") return Layout::kHeadMajor;
  if (text == "seq-major" || text == "bsnh" || text == "BSNH") return Layout::kSeqMajor;
  if (text == "token-major" || text == "token") return Layout::kTokenMajor;
  return Status::InvalidArgument("unknown layout '" + std::string(text) +
                                 "'; known: head-major (bnsh), seq-major (bsnh), token-major "
                                 "(token)");
}

std::vector<Layout> all_layouts() {
  return {Layout::kHeadMajor, Layout::kSeqMajor, Layout::kTokenMajor};
}

Result<LayoutPlan> plan_layout(const Geometry& geometry, Layout layout, std::uint64_t granule,
                               std::uint64_t max_context) {
  const std::string what =
      "plan for '" + geometry.name + "' in the " + std::string(to_string(layout)) + " layout";
  if (granule == 0) {
    return Status::InvalidArgument(what + ": granule must be at least 1 byte, got 0");
  }
  if (geometry.layers == 0 || geometry.kv_heads == 0 || geometry.head_dim == 0 ||
      geometry.element_bytes() == 0) {
    return Status::InvalidArgument(what + ": every dimension must be at least 1, got " +
                                   std::to_string(geometry.layers) + " layers, " +
                                   std::to_string(geometry.kv_heads) + " KV heads, head dim " +
                                   std::to_string(geometry.head_dim) + ", " +
                                   std::to_string(geometry.element_bytes()) + " bytes per element");
  }
  if (max_context == 0) {
    return Status::InvalidArgument(what + ": max context must be at least 1 token, got 0");
  }

  LayoutPlan plan;
  plan.geometry = geometry;
  plan.layout = layout;
  plan.granule = granule;
  plan.max_context = max_context;

  const std::uint64_t layers_kv = std::uint64_t{geometry.layers} * 2;  // K and V
  const std::uint64_t head_bytes = std::uint64_t{geometry.head_dim} * geometry.element_bytes();
  std::uint64_t all_heads_bytes = 0;  // H * D * e
  std::uint64_t all_fragments = 0;    // L * 2 * H
  bool fits = multiply(head_bytes, geometry.kv_heads, all_heads_bytes) &&
              multiply(layers_kv, geometry.kv_heads, all_fragments);
  switch (layout) {
    case Layout::kHeadMajor:
      plan.fragments = all_fragments;
      plan.contiguous_bytes_per_token = head_bytes;
      break;
    case Layout::kSeqMajor:
      plan.fragments = layers_kv;
      plan.contiguous_bytes_per_token = all_heads_bytes;
      break;
    case Layout::kTokenMajor:
      plan.fragments = 1;
      fits = fits && multiply(layers_kv, all_heads_bytes, plan.contiguous_bytes_per_token);
      break;
  }
  std::uint64_t fragment_bytes = 0;
  fits = fits && multiply(plan.fragments, plan.contiguous_bytes_per_token, plan.bytes_per_token) &&
         multiply(max_context, plan.contiguous_bytes_per_token, fragment_bytes);
  // round_up(fragment_bytes, granule) without overflowing on the way.
  const std::uint64_t windows = ceil_div(fragment_bytes, granule);
  fits = fits && multiply(windows, granule, plan.fragment_stride) &&
         multiply(plan.fragments, plan.fragment_stride, plan.slot_stride);
  if (!fits) {
    return Status::InvalidArgument(what + ": a slot of " + std::to_string(max_context) +
                                   " tokens at " + std::to_string(granule) +
                                   "-byte granules does not fit in 64 bits of address");
  }
  return plan;
}

std::uint64_t LayoutPlan::windows_per_fragment(std::uint64_t tokens) const {
  require_planned(*this, "windows_per_fragment");
  require_in_slot(*this, tokens, "windows_per_fragment");
  // tokens * contiguous <= fragment_stride, which plan_layout proved fits.
  return ceil_div(tokens * contiguous_bytes_per_token, granule);
}

std::uint64_t LayoutPlan::commit_floor(std::uint64_t tokens) const {
  // <= slot_stride, which plan_layout proved fits.
  return granule * fragments * windows_per_fragment(tokens);
}

double LayoutPlan::crossover_tokens() const {
  require_planned(*this, "crossover_tokens");
  return static_cast<double>(granule) / static_cast<double>(contiguous_bytes_per_token);
}

KvView LayoutPlan::view(std::uint64_t base) const {
  const std::uint64_t e = geometry.element_bytes();
  const std::uint64_t head_bytes = geometry.head_dim * e;            // D * e
  const std::uint64_t heads_bytes = geometry.kv_heads * head_bytes;  // H * D * e
  KvView view;
  view.base = base;
  view.slot_stride = slot_stride;
  view.element_bytes = geometry.element_bytes();
  view.head_dim = geometry.head_dim;
  view.element = geometry.dtype;
  switch (layout) {
    case Layout::kHeadMajor:
      // Fragment (layer * 2 + kv) * H + head; tokens of one head follow each other.
      view.head_stride = fragment_stride;
      view.kv_stride = geometry.kv_heads * fragment_stride;
      view.layer_stride = 2 * view.kv_stride;
      view.token_stride = head_bytes;
      break;
    case Layout::kSeqMajor:
      // Fragment layer * 2 + kv; a token's heads side by side.
      view.head_stride = head_bytes;
      view.kv_stride = fragment_stride;
      view.layer_stride = 2 * fragment_stride;
      view.token_stride = heads_bytes;
      break;
    case Layout::kTokenMajor:
      // One fragment; a token's layers, K and V, and heads side by side.
      view.head_stride = head_bytes;
      view.kv_stride = heads_bytes;
      view.layer_stride = 2 * heads_bytes;
      view.token_stride = contiguous_bytes_per_token;
      break;
  }
  return view;
}

PrefixShareability prefix_shareability(const LayoutPlan& plan, std::uint64_t prefix_tokens) {
  PrefixShareability result;
  result.prefix_tokens = prefix_tokens;
  const std::string refused = "prefix of " + std::to_string(prefix_tokens) +
                              " tokens not shareable in the " + describe(plan) + ": ";
  if (plan.granule == 0) {
    // Refused before any arithmetic: a zero granule would be a division by zero below.
    result.refusal_reason = refused + "the granule is 0 bytes, so there is no window to map";
    return result;
  }
  if (prefix_tokens == 0) {
    result.refusal_reason = refused + "there is no prefix";
    return result;
  }
  if (prefix_tokens > plan.max_context) {
    result.refusal_reason = refused + "it is longer than the slot's max context of " +
                            std::to_string(plan.max_context) + " tokens";
    return result;
  }
  if (plan.contiguous_bytes_per_token == 0) {
    result.refusal_reason = refused + "the plan has no bytes per token (not made by plan_layout)";
    return result;
  }
  // prefix_tokens <= max_context, so every product below is bounded by the slot stride.
  result.fragment_bytes = prefix_tokens * plan.contiguous_bytes_per_token;
  result.shareable_granules_per_fragment = result.fragment_bytes / plan.granule;
  result.mapping_operations = plan.fragments * result.shareable_granules_per_fragment;
  result.boundary_bytes_per_sharer = plan.fragments * (result.fragment_bytes % plan.granule);
  result.shared_bytes = result.mapping_operations * plan.granule;
  result.shareable = result.shareable_granules_per_fragment > 0;
  if (!result.shareable) {
    // Every window holds prefix and non-prefix bytes, and a window is mapped whole: sharing
    // it would share bytes that differ between sequences.
    const std::uint64_t needed = ceil_div(plan.granule, plan.contiguous_bytes_per_token);
    result.refusal_reason =
        refused + "each of its " + std::to_string(plan.fragments) + " contiguous fragments holds " +
        std::to_string(prefix_tokens) + " tokens x " +
        format_bytes(plan.contiguous_bytes_per_token) + " = " +
        format_bytes(result.fragment_bytes) + " of the prefix, less than one " +
        format_bytes(plan.granule) +
        " granule, so no whole granule lies inside the prefix (fragment_bytes < granule); "
        "sharing needs at least " +
        std::to_string(needed) +
        " prefix tokens in this layout, a smaller granule, or a layout with more contiguous "
        "bytes per token";
  }
  return result;
}

std::optional<std::uint64_t> Concurrency::bytes_without_sharing(std::uint64_t sequences) const {
  std::uint64_t bytes = 0;
  if (!multiply(sequences, per_sequence_bytes, bytes)) return std::nullopt;
  return bytes;
}

std::optional<std::uint64_t> Concurrency::bytes_with_sharing(std::uint64_t sequences) const {
  if (sequences == 0) return std::uint64_t{0};
  std::uint64_t bytes = 0;
  if (!multiply(sequences, private_bytes, bytes) || bytes + prefix_bytes < bytes) {
    return std::nullopt;
  }
  return bytes + prefix_bytes;
}

Concurrency admissible_concurrency(const LayoutPlan& plan, std::uint64_t context_tokens,
                                   std::uint64_t prefix_tokens, std::uint64_t budget_bytes) {
  require_planned(plan, "admissible_concurrency");
  KVVM_CHECK(context_tokens != 0 && context_tokens <= plan.max_context,
             "admissible_concurrency: context of " + std::to_string(context_tokens) +
                 " tokens, need 1 to " + std::to_string(plan.max_context) +
                 " (the slot's max context)");
  KVVM_CHECK(prefix_tokens < context_tokens, "admissible_concurrency: prefix of " +
                                                 std::to_string(prefix_tokens) +
                                                 " tokens must be shorter than the context of " +
                                                 std::to_string(context_tokens) + " tokens");
  Concurrency result;
  result.per_sequence_bytes = plan.commit_floor(context_tokens);
  result.prefix_bytes = prefix_shareability(plan, prefix_tokens).shared_bytes;
  // The shared windows lie wholly inside the prefix, hence inside the context's windows; and
  // prefix < context leaves at least one window of its own per fragment, so private > 0.
  result.private_bytes = result.per_sequence_bytes - result.prefix_bytes;
  result.without_sharing = budget_bytes / result.per_sequence_bytes;
  // The first sequence pays prefix + private (= per_sequence), each further one private only:
  // n sequences need prefix + n * private. The shorter 1 + floor((B - prefix) / private)
  // counts one too many (B = prefix + private would admit two); this is floor((B - prefix) /
  // private), written so that it cannot go below zero.
  result.with_sharing = budget_bytes >= result.per_sequence_bytes
                            ? 1 + (budget_bytes - result.per_sequence_bytes) / result.private_bytes
                            : 0;
  return result;
}

}  // namespace kvvm
