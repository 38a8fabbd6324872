// Layouts and their arithmetic (docs/ARCHITECTURE.md "Layouts and their arithmetic"): pure
// functions of a geometry, a layout, the granule and the maximum context. No driver.
//
// A fragment is a piece of one sequence's KV that is contiguous in memory; every fragment
// starts on a granule boundary of its slot, so for n live tokens
//   committed bytes = granule * sum over fragments of ceil(n * contiguous / granule).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/kv/kv_view.h"

namespace kvvm {

enum class Layout {
  kHeadMajor,   // BNSH: [layer][k|v][head][token][dim]; L*2*H fragments of D*e per token
  kSeqMajor,    // BSNH: [layer][k|v][token][head][dim]; L*2 fragments of H*D*e per token
  kTokenMajor,  // [token][layer][k|v][head][dim]; 1 fragment of L*2*H*D*e per token (default)
};
std::string_view to_string(Layout layout);           // "head-major", "seq-major", "token-major"
Result<Layout> parse_layout(std::string_view text);  // those names, or bnsh / bsnh / token
std::vector<Layout> all_layouts();

// Everything derived for one (geometry, layout, granule, max context).
struct LayoutPlan {
  Geometry geometry;
  Layout layout = Layout::kTokenMajor;
  std::uint64_t granule = 0;
  std::uint64_t max_context = 0;  // tokens

  std::uint64_t fragments = 0;                   // per sequence
  std::uint64_t contiguous_bytes_per_token = 0;  // in one fragment
  std::uint64_t bytes_per_token = 0;             // all fragments
  std::uint64_t fragment_stride = 0;             // round_up(max_context * contiguous, granule)
  std::uint64_t slot_stride = 0;                 // fragments * fragment_stride

  // REQUIRES for the three below: a plan made by plan_layout (granule and contiguous bytes
  // non-zero) and tokens <= max_context (a slot holds no more); KVVM_CHECK aborts otherwise.
  //
  // Windows (granules) of one fragment holding at least one of n live tokens' bytes:
  // ceil(n * contiguous / granule).
  std::uint64_t windows_per_fragment(std::uint64_t tokens) const;
  // granule * fragments * windows_per_fragment(n): what n tokens commit.
  std::uint64_t commit_floor(std::uint64_t tokens) const;
  // granule / contiguous: below this length the floor is set by granule rounding, above it
  // by the live bytes (may be fractional: token-major fills a granule in a few tokens).
  double crossover_tokens() const;
  // Strides of this layout, with `base` the address of slot 0.
  KvView view(std::uint64_t base) const;
};

// InvalidArgument for a zero granule, a zero dimension, a zero max context, or a slot stride
// that overflows 64 bits — each naming the value.
Result<LayoutPlan> plan_layout(const Geometry& geometry, Layout layout, std::uint64_t granule,
                               std::uint64_t max_context);

// Whether P prefix tokens can be shared by mapping whole windows:
//   fragment_bytes = P * contiguous; shareable iff fragment_bytes >= granule;
//   shareable granules per fragment = floor(fragment_bytes / granule);
//   mapping operations = fragments * that;
//   boundary bytes each sharer still holds privately = fragments * (fragment_bytes mod granule).
struct PrefixShareability {
  std::uint64_t prefix_tokens = 0;
  bool shareable = false;
  std::uint64_t fragment_bytes = 0;
  std::uint64_t shareable_granules_per_fragment = 0;
  std::uint64_t mapping_operations = 0;
  std::uint64_t boundary_bytes_per_sharer = 0;
  std::uint64_t shared_bytes = 0;  // fragments * shareable granules * granule
  std::string refusal_reason;      // in words, when not shareable; empty otherwise
};
// Never throws: a granule of 0, no prefix, or a prefix longer than the slot's max context is
// refused with its reason like any other unshareable prefix.
PrefixShareability prefix_shareability(const LayoutPlan& plan, std::uint64_t prefix_tokens);

// How many sequences of `context_tokens` (prefix included) fit in `budget_bytes`, where
// prefix = the shareable bytes of the prefix (0 when not shareable) and
// private = commit_floor(context) - prefix:
//   without sharing floor(B / (prefix + private));
//   with sharing the first sequence pays prefix + private and each further one private, so
//   1 + floor((B - prefix - private) / private) when B >= prefix + private, else 0.
// (The shorter 1 + floor((B - prefix) / private) would count one sequence too many.)
struct Concurrency {
  std::uint64_t per_sequence_bytes = 0;  // commit_floor(context)
  std::uint64_t prefix_bytes = 0;        // shared once
  std::uint64_t private_bytes = 0;       // per sequence, with sharing
  std::uint64_t without_sharing = 0;
  std::uint64_t with_sharing = 0;

  // What `sequences` sequences commit: sequences * (prefix + private) without sharing,
  // prefix + sequences * private with it (0 for no sequence). Nullopt past 64 bits.
  std::optional<std::uint64_t> bytes_without_sharing(std::uint64_t sequences) const;
  std::optional<std::uint64_t> bytes_with_sharing(std::uint64_t sequences) const;
};
// REQUIRES: a plan made by plan_layout, 1 <= context_tokens <= plan.max_context and
// prefix_tokens < context_tokens (a sequence holds at least one token of its own, so private
// is never 0); KVVM_CHECK aborts otherwise.
Concurrency admissible_concurrency(const LayoutPlan& plan, std::uint64_t context_tokens,
                                   std::uint64_t prefix_tokens, std::uint64_t budget_bytes);

}  // namespace kvvm
