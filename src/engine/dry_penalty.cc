#include "dry_penalty.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace kvvm::engine {

void append_dry_penalties(std::span<const std::int32_t> context, const DryPenalty& dry,
                          std::vector<model::LogitAdjustment>& out,
                          std::vector<std::int64_t>& scratch) {
  if (dry.multiplier <= 0 || context.empty()) return;
  if (dry.last_n > 0 && context.size() > dry.last_n) context = context.last(dry.last_n);
  const std::size_t n = context.size();
  // The context reversed (r[0] the last token), each breaker a value of its own that matches
  // nothing, so no repetition runs across it.
  std::vector<std::int64_t>& r = scratch;
  r.resize(2 * n);
  std::int64_t* z = r.data() + n;
  for (std::size_t k = 0; k < n; ++k) {
    const std::int32_t token = context[n - 1 - k];
    const bool breaker = std::binary_search(dry.breakers.begin(), dry.breakers.end(), token);
    r[k] = breaker ? -1 - static_cast<std::int64_t>(k) : token;
  }
  // z[k]: the longest common prefix of r and r[k..] (the Z-function, z[0] unused).
  z[0] = static_cast<std::int64_t>(n);
  std::size_t left = 0, right = 0;  // the rightmost match [left, right) found so far
  for (std::size_t k = 1; k < n; ++k) {
    std::size_t length = 0;
    if (k < right) length = std::min<std::size_t>(right - k, static_cast<std::size_t>(z[k - left]));
    while (k + length < n && r[length] == r[k + length]) ++length;
    z[k] = static_cast<std::int64_t>(length);
    if (k + length > right) {
      left = k;
      right = k + length;
    }
  }
  // The context's last L tokens also end at position n - 1 - k, where r[k - 1] followed them.
  std::unordered_map<std::int32_t, std::uint32_t> longest;
  for (std::size_t k = 1; k < n; ++k) {
    const auto length = static_cast<std::uint32_t>(z[k]);
    if (length < std::max<std::uint32_t>(dry.allowed_length, 1) || r[k - 1] < 0) continue;
    const auto next = static_cast<std::int32_t>(r[k - 1]);
    std::uint32_t& best = longest[next];
    best = std::max(best, length);
  }
  for (const auto& [token, length] : longest) {
    const std::uint32_t exponent = std::min(length - dry.allowed_length, kDryMaxExponent);
    const double penalty = static_cast<double>(dry.multiplier) *
                           std::pow(static_cast<double>(dry.base), static_cast<double>(exponent));
    out.push_back(model::LogitAdjustment{.id = token, .bias = -static_cast<float>(penalty)});
  }
}

}  // namespace kvvm::engine
