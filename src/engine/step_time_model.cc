#include "engine/step_time_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvvm::engine {

void StepTimeModel::observe(std::uint32_t tokens, std::chrono::nanoseconds took) {
  const double x = tokens;
  const double y = std::chrono::duration<double>(took).count();
  weight_ = kDecay * weight_ + 1;
  x_ = kDecay * x_ + x;
  xx_ = kDecay * xx_ + x * x;
  y_ = kDecay * y_ + y;
  xy_ = kDecay * xy_ + x * y;
}

std::optional<StepTimeModel::Line> StepTimeModel::line() const {
  if (weight_ <= 0) return std::nullopt;
  const double mean_x = x_ / weight_, mean_y = y_ / weight_;
  const double spread = xx_ / weight_ - mean_x * mean_x;  // weighted variance of the tokens
  if (!(spread >= kMinSpread)) return std::nullopt;
  const double covariance = xy_ / weight_ - mean_x * mean_y;
  const double per_token = covariance / spread;
  if (!(per_token > 0) || !std::isfinite(per_token)) return std::nullopt;
  return Line{.fixed = std::max(0.0, mean_y - per_token * mean_x), .per_token = per_token};
}

std::optional<double> StepTimeModel::predict(std::uint32_t tokens) const {
  const std::optional<Line> l = line();
  if (!l) return std::nullopt;
  return l->fixed + l->per_token * tokens;
}

std::optional<std::uint32_t> StepTimeModel::prefill_share(std::chrono::nanoseconds target,
                                                          std::uint32_t decodes,
                                                          std::uint32_t floor) const {
  const std::optional<Line> l = line();
  if (!l) return std::nullopt;
  const double left = std::chrono::duration<double>(target).count() - l->fixed -
                      l->per_token * static_cast<double>(decodes);
  const double tokens = std::floor(left / l->per_token);
  constexpr double kMost = std::numeric_limits<std::uint32_t>::max();
  return std::max(floor, static_cast<std::uint32_t>(std::clamp(tokens, 0.0, kMost)));
}

}  // namespace kvvm::engine
