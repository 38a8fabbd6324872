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
  return seconds(*l, tokens);
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

std::optional<std::uint32_t> StepTimeModel::deadline_share(std::uint32_t decodes,
                                                           std::span<const PromptDue> prompts,
                                                           std::uint32_t most) const {
  const std::optional<Line> l = line();
  if (!l) return std::nullopt;
  // A share past the prompts' tokens computes nothing more: it is no share they could use, and
  // its step would be predicted longer than the one that runs.
  std::uint64_t total = 0;
  for (const PromptDue& p : prompts) total += p.tokens_left;
  most = static_cast<std::uint32_t>(std::min<std::uint64_t>(most, total));
  if (most == 0) return 0;
  // When a prompt of `cumulative` tokens, counting those served before it, finishes at a share
  // of `share` tokens a step: after ceil(cumulative / share) steps of decodes + share tokens.
  const auto finish = [&](std::uint64_t cumulative, std::uint32_t share) {
    const std::uint64_t steps = (cumulative + share - 1) / share;
    return static_cast<double>(steps) * seconds(*l, std::uint64_t{decodes} + share);
  };
  // Whether the prompt counts: it can still make its deadline at `most` (none late does).
  const auto counts = [&](std::uint64_t cumulative, const PromptDue& p) {
    return p.seconds_left > 0 && finish(cumulative, most) <= p.seconds_left;
  };
  // Where to start: no share below what the prompts allow without the ceil (ceil(C/s) >= C/s,
  // so C/s * (a + b s) <= T gives s >= C a / (T - C b), a the step's time without prefill and
  // b the time of a token), a little under so that rounding never skips the answer.
  const double without_prefill = seconds(*l, decodes);
  double lowest = 1;
  bool any = false;
  std::uint64_t cumulative = 0;
  for (const PromptDue& p : prompts) {
    cumulative += p.tokens_left;
    if (!counts(cumulative, p)) continue;
    any = true;
    const double c = static_cast<double>(cumulative);
    const double room = p.seconds_left - c * l->per_token;
    if (room > 0) lowest = std::max(lowest, c * without_prefill / room);
  }
  if (!any) return 0;
  std::uint32_t share = static_cast<std::uint32_t>(
      std::clamp(std::floor(lowest * (1 - 1e-9)), 1.0, static_cast<double>(most)));
  // A prompt that misses its deadline at `share` misses it at every share up to where its steps
  // drop by one (ceil(C / (k - 1)) for its k steps now: within the same number of steps a larger
  // share only makes each longer), so the search jumps past the farthest such point until none
  // misses. It ends by `most`, where every prompt that counts makes it.
  while (share < most) {
    std::uint32_t next = share;
    cumulative = 0;
    for (const PromptDue& p : prompts) {
      cumulative += p.tokens_left;
      if (!counts(cumulative, p) || finish(cumulative, share) <= p.seconds_left) continue;
      const std::uint64_t steps = (cumulative + share - 1) / share;
      if (steps <= 1) return most;  // cannot miss within one step if it makes it at most
      const std::uint64_t fewer = (cumulative + steps - 2) / (steps - 1);
      next = static_cast<std::uint32_t>(
          std::max<std::uint64_t>(next, std::min<std::uint64_t>(fewer, most)));
    }
    if (next == share) return share;
    share = next;
  }
  return most;
}

}  // namespace kvvm::engine
