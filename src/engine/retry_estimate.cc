// RetryEstimate: the queue ahead divided by the recent admission rate.
#include "retry_estimate.h"

#include <algorithm>

namespace kvvm::engine {

void RetryEstimate::note_admission(Clock::time_point when) {
  times_[next_] = when;
  next_ = (next_ + 1) % kSamples;
  count_ = std::min(count_ + 1, kSamples);
}

double RetryEstimate::seconds(std::uint64_t waiting, std::uint32_t parallel,
                              Clock::time_point now) const {
  // Admissions inside the window, and the oldest of them.
  std::size_t recent = 0;
  Clock::time_point oldest = now;
  for (std::size_t i = 0; i < count_; ++i) {
    const Clock::time_point t = times_[(next_ + kSamples - 1 - i) % kSamples];
    if (now - t > kWindow) break;  // the ring is in time order, newest first here
    ++recent;
    oldest = t;
  }
  const double ahead = static_cast<double>(waiting) + 1;  // the refused request itself
  double estimate = 0;
  const double span = std::chrono::duration<double>(now - oldest).count();
  if (recent >= 2 && span > 0) {
    // The oldest admission opens the span: the others happened inside it.
    estimate = ahead / (static_cast<double>(recent - 1) / span);
  } else {
    estimate = ahead / static_cast<double>(std::max<std::uint32_t>(parallel, 1));
  }
  return std::clamp(estimate, kMinSeconds, kMaxSeconds);
}

}  // namespace kvvm::engine
