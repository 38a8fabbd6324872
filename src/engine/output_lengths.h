// OutputLengths: how many tokens a running answer has still to generate, learned from the
// answers that ended.
//
// An answer ends at a stop (its own length) or at its cap (max_tokens: its own length is then
// unknown, at least the cap). The estimate for one that has generated g of at most c is
//   f (c - g) + (1 - f) E[min(L, c) - g | L > g]
// where f is the share of recent answers that ended at their cap and L runs over the recent
// lengths of those that stopped: a load whose answers run to their caps (a benchmark's fixed
// lengths, short caps) is predicted from the caps; one that stops on its own is predicted
// from how long answers that got as far as this one went on. An answer longer than every
// stopped one is predicted to run to its cap.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvvm::engine {

class OutputLengths {
 public:
  static constexpr std::size_t kSamples = 256;  // the latest answers ended
  // Answers ended before an estimate is trusted: a cold server must not refuse anyone on the
  // caps alone, which clients often set far above what they expect.
  static constexpr std::size_t kMinSamples = 8;

  // An answer ended after `generated` tokens; `at_cap`: it was stopped by its cap.
  void note(std::uint32_t generated, bool at_cap);
  // Whether kMinSamples answers were noted.
  bool known() const { return count_ >= kMinSamples; }
  // Brings the sorted view up to date after notes; called before estimating.
  void refresh();
  // Tokens still to come from an answer that has generated `generated` of at most `cap`
  // (refresh() first); 0 when generated >= cap.
  double remaining(std::uint32_t generated, std::uint32_t cap) const;
  // The mean length of the answers noted (capped ones at their cap); 0 before any.
  double mean() const;

 private:
  struct Sample {
    std::uint32_t generated = 0;
    bool at_cap = false;
  };
  std::array<Sample, kSamples> samples_{};  // a ring
  std::size_t next_ = 0;
  std::size_t count_ = 0;
  bool dirty_ = false;
  // The ring's stopped lengths, ascending, and their prefix sums (stopped_sums_[i]: the sum
  // of the first i); the share that ended at their cap; the mean of all.
  std::vector<std::uint32_t> stopped_;
  std::vector<double> stopped_sums_;
  double at_cap_share_ = 0;
  double mean_ = 0;
};

}  // namespace kvvm::engine
