#include "logit_transforms.h"

#include <algorithm>
#include <limits>
#include <span>

#include "dry_penalty.h"

namespace kvvm::engine {
namespace {

bool counts_output(const model::SamplingParams& p) {
  return p.presence_penalty != 0 || p.frequency_penalty != 0 || p.repetition_penalty != 1;
}

bool bans_ends(const RequestState& r) {
  return r.generated < r.request.min_tokens && !r.ends.empty();
}

}  // namespace

bool has_logit_transforms(const RequestState& r) {
  return counts_output(r.request.sampling) || !r.request.logit_bias.empty() || bans_ends(r) ||
         r.request.dry.multiplier > 0;
}

std::size_t logit_transform_bound(const RequestState& r, std::uint32_t vocab) {
  if (!has_logit_transforms(r)) return 0;
  std::size_t bound = r.request.logit_bias.size() + (bans_ends(r) ? r.ends.size() : 0);
  if (counts_output(r.request.sampling)) bound += r.tokens.size() - r.prompt_size;
  if (r.request.sampling.repetition_penalty != 1) bound += r.prompt_size;
  if (r.request.dry.multiplier > 0) bound += r.tokens.size();  // a penalized token a place
  return std::min<std::size_t>(bound, vocab);
}

void append_logit_transforms(const RequestState& r, std::vector<model::LogitAdjustment>& out,
                             std::vector<model::LogitAdjustment>& scratch) {
  scratch.clear();
  // DRY's penalties are biases, summed with logit_bias's below.
  thread_local std::vector<std::int64_t> dry_scratch;
  append_dry_penalties(std::span<const std::int32_t>(r.tokens), r.request.dry, scratch,
                       dry_scratch);
  const model::SamplingParams& p = r.request.sampling;
  // One entry per mention first, merged by id below.
  if (counts_output(p)) {
    for (std::size_t i = r.prompt_size; i < r.tokens.size(); ++i) {
      scratch.push_back(model::LogitAdjustment{.id = r.tokens[i], .count = 1});
    }
  }
  if (p.repetition_penalty != 1) {
    for (std::size_t i = 0; i < r.prompt_size; ++i) {
      scratch.push_back(model::LogitAdjustment{.id = r.tokens[i], .in_prompt = 1});
    }
  }
  for (const auto& [id, bias] : r.request.logit_bias) {
    scratch.push_back(model::LogitAdjustment{.id = id, .bias = bias});
  }
  // Before min_tokens the end tokens cannot be drawn.
  if (bans_ends(r)) {
    for (const std::int32_t end : r.ends) {
      scratch.push_back(
          model::LogitAdjustment{.id = end, .bias = -std::numeric_limits<float>::infinity()});
    }
  }
  std::sort(scratch.begin(), scratch.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  const std::size_t first = out.size();
  for (const model::LogitAdjustment& a : scratch) {
    if (out.size() > first && out.back().id == a.id) {
      out.back().count += a.count;
      out.back().in_prompt |= a.in_prompt;
      out.back().bias += a.bias;  // a ban (-inf) stays one
    } else {
      out.push_back(a);
    }
  }
}

}  // namespace kvvm::engine
