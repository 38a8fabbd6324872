// RetryEstimate: the queue ahead divided by the recent admission rate.
#include "retry_estimate.h"

#include <algorithm>
#include <cmath>

namespace kvvm::engine {

void RetryEstimate::note_admission(Clock::time_point when) {
  times_[next_] = when;
  next_ = (next_ + 1) % kSamples;
  count_ = std::min(count_ + 1, kSamples);
}

std::optional<double> RetryEstimate::rate(Clock::time_point now) const {
  // Admissions inside the window, and the oldest of them.
  std::size_t recent = 0;
  Clock::time_point oldest = now;
  for (std::size_t i = 0; i < count_; ++i) {
    const Clock::time_point t = times_[(next_ + kSamples - 1 - i) % kSamples];
    if (now - t > kWindow) break;  // the ring is in time order, newest first here
    ++recent;
    oldest = t;
  }
  const double span = std::chrono::duration<double>(now - oldest).count();
  if (recent < 2 || span <= 0) return std::nullopt;
  // The oldest admission opens the span: the others happened inside it.
  const double window = static_cast<double>(recent - 1) / span;
  if (!(backlog_seconds_ > 0)) return window;
  return std::min(window, (backlog_admissions_ + 1) / backlog_seconds_);
}

void RetryEstimate::note_step(Clock::time_point now, bool backlog, std::uint32_t admitted) {
  const std::optional<Clock::time_point> last = last_step_;
  last_step_ = now;
  if (!last || now <= *last) return;
  const double dt = std::chrono::duration<double>(now - *last).count();
  const double keep = std::exp(-dt / kBacklogDecay);
  backlog_seconds_ *= keep;
  backlog_admissions_ *= keep;
  if (!backlog) return;
  backlog_seconds_ += dt;
  backlog_admissions_ += admitted;
}

double RetryEstimate::seconds(std::uint64_t waiting, std::uint32_t parallel,
                              Clock::time_point now) const {
  const double ahead = static_cast<double>(waiting) + 1;  // the refused request itself
  const std::optional<double> measured = rate(now);
  const double estimate = measured
                              ? ahead / *measured
                              : ahead / static_cast<double>(std::max<std::uint32_t>(parallel, 1));
  return std::clamp(estimate, kMinSeconds, kMaxSeconds);
}

std::optional<double> RetryEstimate::predicted_wait(std::uint64_t ahead,
                                                    Clock::time_point now) const {
  const std::optional<double> measured = rate(now);
  if (!measured) return std::nullopt;
  return static_cast<double>(ahead) / *measured;
}

void RetryEstimate::note_wait(double predicted, double waited, double floor) {
  const double expected = std::max(predicted, floor);
  if (!(expected > 0)) return;  // no scale to measure against (a zero bound)
  shortfalls_[next_shortfall_] = waited / expected;
  next_shortfall_ = (next_shortfall_ + 1) % kWaitSamples;
}

double RetryEstimate::margin() const {
  // Unused entries are 0, below the floor of 1.
  const double worst = *std::max_element(shortfalls_.begin(), shortfalls_.end());
  return std::clamp(worst, 1.0, kMaxMargin);
}

}  // namespace kvvm::engine
