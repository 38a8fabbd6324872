// WaitForecast: a min-heap of the steps at which the places free, popped once a position.
#include "wait_forecast.h"

#include <algorithm>
#include <functional>

namespace kvvm::engine {

void WaitForecast::build(std::uint32_t places, std::span<const double> busy,
                         std::span<const double> queued, double typical, double step_seconds,
                         Clock::time_point at) {
  admitted_at_.clear();
  valid_ = places > 0;
  if (!valid_) return;
  heap_.assign(busy.begin(), busy.end());
  if (heap_.size() < places) heap_.resize(places, 0.0);  // free places: now
  std::make_heap(heap_.begin(), heap_.end(), std::greater<double>());
  for (const double holds : queued) take(holds);
  typical_ = typical;
  turnover_ = typical / places;
  step_seconds_ = step_seconds;
  at_ = at;
}

void WaitForecast::take(double holds) {
  const auto later = std::greater<double>();  // a min-heap
  std::pop_heap(heap_.begin(), heap_.end(), later);
  const double frees = heap_.back();
  admitted_at_.push_back(frees);
  heap_.back() = frees + holds;
  std::push_heap(heap_.begin(), heap_.end(), later);
}

void WaitForecast::clear() {
  valid_ = false;
  admitted_at_.clear();
}

std::optional<double> WaitForecast::steps(std::uint64_t ahead) {
  if (!valid_) return std::nullopt;
  while (admitted_at_.size() <= ahead && admitted_at_.size() < kMaxPositions) take(typical_);
  if (ahead < admitted_at_.size()) return admitted_at_[ahead];
  const std::uint64_t beyond = ahead - (admitted_at_.size() - 1);
  return admitted_at_.back() + static_cast<double>(beyond) * turnover_;
}

std::optional<double> WaitForecast::wait(std::uint64_t ahead, Clock::time_point now) {
  const std::optional<double> n = steps(ahead);
  if (!n) return std::nullopt;
  const double since = std::chrono::duration<double>(now - at_).count();
  return std::max(0.0, *n * step_seconds_ - since);
}

}  // namespace kvvm::engine
