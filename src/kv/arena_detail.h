// Small pieces the arena's source files share: message text and the latency histogram's size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvvm/arena.h"
#include "kvvm/status.h"

namespace kvvm::detail {

inline constexpr std::size_t kLatencyBuckets = 24;  // 2^24 µs = 16.8 s

inline std::string slot_text(SlotId slot) { return "slot " + std::to_string(slot); }

// "WHAT N tokens: beyond the max context of M".
inline Status beyond_context(std::string_view what, std::uint64_t tokens,
                             std::uint64_t max_context) {
  return Status::InvalidArgument(std::string(what) + " " + std::to_string(tokens) +
                                 " tokens: beyond the max context of " +
                                 std::to_string(max_context));
}

}  // namespace kvvm::detail
