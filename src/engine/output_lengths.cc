// OutputLengths: the mean residual length of the stopped answers, mixed with the caps by the
// share of answers that ran to theirs.
#include "output_lengths.h"

#include <algorithm>

namespace kvvm::engine {

void OutputLengths::note(std::uint32_t generated, bool at_cap) {
  samples_[next_] = Sample{generated, at_cap};
  next_ = (next_ + 1) % kSamples;
  count_ = std::min(count_ + 1, kSamples);
  dirty_ = true;
}

void OutputLengths::refresh() {
  if (!dirty_) return;
  dirty_ = false;
  stopped_.clear();
  std::size_t at_cap = 0;
  double sum = 0;
  for (std::size_t i = 0; i < count_; ++i) {
    const Sample& s = samples_[i];
    sum += s.generated;
    if (s.at_cap) {
      ++at_cap;
    } else {
      stopped_.push_back(s.generated);
    }
  }
  std::sort(stopped_.begin(), stopped_.end());
  stopped_sums_.assign(stopped_.size() + 1, 0);
  for (std::size_t i = 0; i < stopped_.size(); ++i) {
    stopped_sums_[i + 1] = stopped_sums_[i] + stopped_[i];
  }
  at_cap_share_ = count_ == 0 ? 0 : static_cast<double>(at_cap) / static_cast<double>(count_);
  mean_ = count_ == 0 ? 0 : sum / static_cast<double>(count_);
}

double OutputLengths::remaining(std::uint32_t generated, std::uint32_t cap) const {
  if (generated >= cap) return 0;
  const double to_cap = static_cast<double>(cap - generated);
  // The stopped answers that got further than this one; those past the cap count as the cap.
  const auto begin = std::upper_bound(stopped_.begin(), stopped_.end(), generated);
  const auto within = std::upper_bound(begin, stopped_.end(), cap);
  const auto further = static_cast<std::size_t>(stopped_.end() - begin);
  if (further == 0) return to_cap;  // longer than every stopped answer: to its cap
  const auto first = static_cast<std::size_t>(begin - stopped_.begin());
  const auto last = static_cast<std::size_t>(within - stopped_.begin());
  const double past_cap = static_cast<double>(stopped_.size() - last) * cap;
  const double stopped_mean =
      (stopped_sums_[last] - stopped_sums_[first] + past_cap) / static_cast<double>(further);
  const double by_stops = stopped_mean - generated;
  return at_cap_share_ * to_cap + (1 - at_cap_share_) * by_stops;
}

double OutputLengths::mean() const { return mean_; }

}  // namespace kvvm::engine
