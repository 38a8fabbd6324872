// Sampling: one pure function of (logits, params, counter), so a request's tokens depend on
// its seed and nothing else that runs beside it.
#include "kvvm/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace kvvm::model {
namespace {

// splitmix64's finalizer: a bijection on 64 bits that scatters every input bit.
std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Argmax over the non-NaN logits, lowest id among equal maxima; 0 when every logit is NaN.
std::int32_t greedy(std::span<const float> logits) {
  std::int32_t best = -1;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[static_cast<std::size_t>(best)]) {
      best = static_cast<std::int32_t>(i);
    }
  }
  return best < 0 ? 0 : best;
}

struct Candidate {
  std::int32_t id;
  double weight;  // logit / T, then exp(. - max)
};

// Descending by weight; the lower id first among equals, so the order (and the token a
// given uniform picks) is a function of the logits alone.
bool before(const Candidate& a, const Candidate& b) {
  return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
}

// What sample_token draws from: the candidates in its walk order with their masses
// exp(l / T - max) after the min_p, top-k and top-p cuts, and `total`, the sum of those masses
// in that order (>= 1: the most likely candidate always stays, of mass 1). False when the draw
// is the argmax instead: temperature 0, top_k 1, no valid logit or no finite maximum.
bool truncated_candidates(std::span<const float> logits, const SamplingParams& params,
                          std::vector<Candidate>& candidates, double& total) {
  if (params.temperature == 0 || params.top_k == 1) return false;
  const double temperature = params.temperature;
  candidates.clear();
  candidates.reserve(logits.size());
  double max_weight = -INFINITY;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    const double weight = static_cast<double>(logits[i]) / temperature;
    candidates.push_back({static_cast<std::int32_t>(i), weight});
    max_weight = std::max(max_weight, weight);
  }
  // No finite maximum: every probability is 0 (all -inf) or concentrated on +inf; the
  // softmax is undefined, its limit is the argmax.
  if (candidates.empty() || !std::isfinite(max_weight)) return false;
  // Whether top-k truncates is decided on every valid logit, before min_p, as the CUDA kernel
  // decides it (the walk order, and so the token a uniform picks, depends on it).
  const std::size_t valid = candidates.size();
  if (params.min_p > 0) {
    // p / p_max >= min_p, in the log domain and in double as the CUDA kernel tests it; the
    // maximum always stays (0 >= log(min_p)).
    const double floor = std::log(static_cast<double>(params.min_p));
    std::erase_if(candidates,
                  [&](const Candidate& c) { return !(c.weight - max_weight >= floor); });
  }

  // Truncation needs the candidates in descending order; without it the id order serves and
  // saves a sort over the whole vocabulary.
  const bool top_k = params.top_k > 0 && params.top_k < valid;
  const bool top_p = params.top_p < 1;
  if (top_k) {
    const std::size_t k = std::min<std::size_t>(params.top_k, candidates.size());
    std::partial_sort(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k),
                      candidates.end(), before);
    candidates.resize(k);
  } else if (top_p) {
    std::sort(candidates.begin(), candidates.end(), before);
  }
  total = 0;
  for (Candidate& c : candidates) {
    c.weight = std::exp(c.weight - max_weight);
    total += c.weight;
  }
  if (top_p) {
    // The smallest prefix whose probability reaches p (the first candidate always stays).
    const double target = static_cast<double>(params.top_p) * total;
    double kept = 0;
    std::size_t n = 0;
    while (n < candidates.size()) {
      kept += candidates[n].weight;
      ++n;
      if (kept >= target) break;
    }
    candidates.resize(n);
    total = kept;
  }
  return true;
}

}  // namespace

Status check_sampling(const SamplingParams& params) {
  if (!std::isfinite(params.temperature) || params.temperature < 0) {
    return Status::InvalidArgument("temperature " + std::to_string(params.temperature) +
                                   ": must be finite and >= 0 (0: greedy)");
  }
  if (!(params.top_p > 0 && params.top_p <= 1)) {
    return Status::InvalidArgument("top_p " + std::to_string(params.top_p) +
                                   ": must lie in (0, 1]");
  }
  if (!(params.min_p >= 0 && params.min_p <= 1)) {
    return Status::InvalidArgument("min_p " + std::to_string(params.min_p) +
                                   ": must lie in [0, 1] (0: off)");
  }
  if (!std::isfinite(params.presence_penalty)) {
    return Status::InvalidArgument("presence_penalty " + std::to_string(params.presence_penalty) +
                                   ": must be finite");
  }
  if (!std::isfinite(params.frequency_penalty)) {
    return Status::InvalidArgument("frequency_penalty " + std::to_string(params.frequency_penalty) +
                                   ": must be finite");
  }
  if (!std::isfinite(params.repetition_penalty) || params.repetition_penalty <= 0) {
    return Status::InvalidArgument("repetition_penalty " +
                                   std::to_string(params.repetition_penalty) +
                                   ": must be finite and > 0 (1: none)");
  }
  return Status::Ok();
}

float adjusted_logit(float logit, const SamplingParams& params, const LogitAdjustment& a) {
  float l = logit + a.bias;
  if (params.repetition_penalty != 1 && (a.count > 0 || a.in_prompt != 0)) {
    l = l > 0 ? l / params.repetition_penalty : l * params.repetition_penalty;
  }
  l -= params.frequency_penalty * static_cast<float>(a.count) +
       (a.count > 0 ? params.presence_penalty : 0.0f);
  return l;
}

void adjust_logits(std::span<float> logits, const SamplingParams& params,
                   std::span<const LogitAdjustment> adjustments) {
  for (const LogitAdjustment& a : adjustments) {
    float& l = logits[static_cast<std::size_t>(a.id)];
    l = adjusted_logit(l, params, a);
  }
}

double counter_uniform(std::uint64_t seed, std::uint64_t counter) {
  // Two rounds keep (seed, counter) and (seed', counter') with equal sums or xors apart.
  const std::uint64_t h =
      mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ (counter * 0xd1b54a32d192ed03ull + 1));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

void mask_logits(std::span<float> logits, std::span<const std::uint32_t> mask) {
  KVVM_CHECK(mask.size() * 32 >= logits.size(), "a token mask shorter than its row");
  for (std::size_t t = 0; t < logits.size(); ++t) {
    if (((mask[t >> 5] >> (t & 31)) & 1) == 0) logits[t] = -std::numeric_limits<float>::infinity();
  }
}

std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::uint64_t counter) {
  std::vector<Candidate> candidates;
  double total = 0;
  if (!truncated_candidates(logits, params, candidates, total)) return greedy(logits);
  // Inverse CDF. u * total may round up to total itself: then the last candidate of positive
  // probability takes it (never one of probability 0).
  const double u = counter_uniform(params.seed, counter) * total;
  double cumulative = 0;
  std::int32_t last_positive = candidates.front().id;
  for (const Candidate& c : candidates) {
    if (c.weight <= 0) continue;
    cumulative += c.weight;
    last_positive = c.id;
    if (u < cumulative) return c.id;
  }
  return last_positive;
}

void sampling_distribution(std::span<const float> logits, const SamplingParams& params,
                           std::span<double> out) {
  KVVM_CHECK(out.size() == logits.size(), "a sampling distribution not the size of its row");
  std::fill(out.begin(), out.end(), 0.0);
  std::vector<Candidate> candidates;
  double total = 0;
  if (!truncated_candidates(logits, params, candidates, total)) {
    out[static_cast<std::size_t>(greedy(logits))] = 1;
    return;
  }
  for (const Candidate& c : candidates) out[static_cast<std::size_t>(c.id)] = c.weight / total;
}

void row_logprobs(std::span<const float> logits, float temperature, std::int32_t target,
                  std::uint32_t top, float* target_logprob, std::int32_t* top_ids,
                  float* top_logprobs) {
  top = std::min(top, kMaxTopLogprobs);
  const double scale = temperature > 0 ? 1.0 / static_cast<double>(temperature) : 1.0;
  double max_logit = -INFINITY;
  for (const float l : logits) {
    if (!std::isnan(l)) max_logit = std::max(max_logit, static_cast<double>(l));
  }
  // log_softmax(l * scale) = (l - max) * scale - log(sum exp((l - max) * scale)): the maximum
  // first, so no term overflows. An empty row (all NaN, all -inf) gives NaN, not a trap.
  double total = 0;
  if (std::isfinite(max_logit)) {
    for (const float l : logits) {
      if (!std::isnan(l)) total += std::exp((static_cast<double>(l) - max_logit) * scale);
    }
  }
  const double log_total = std::isfinite(max_logit) ? std::log(total) : NAN;
  auto logprob = [&](float l) {
    return static_cast<float>((static_cast<double>(l) - max_logit) * scale - log_total);
  };
  const bool in_vocabulary = target >= 0 && static_cast<std::size_t>(target) < logits.size();
  *target_logprob = in_vocabulary ? logprob(logits[static_cast<std::size_t>(target)]) : NAN;

  // The `top` best by logit (the scale keeps the order), kept sorted by insertion: a logit
  // enters only when it beats the last kept, which few of a long row do.
  std::uint32_t kept = 0;
  for (std::size_t i = 0; i < logits.size() && top > 0; ++i) {
    const float l = logits[i];
    if (std::isnan(l)) continue;
    // Ids arrive ascending: an equal logit ranks after the kept ones.
    if (kept == top && !(l > logits[static_cast<std::size_t>(top_ids[top - 1])])) continue;
    std::uint32_t at = kept < top ? kept++ : top - 1;
    while (at > 0 && l > logits[static_cast<std::size_t>(top_ids[at - 1])]) {
      top_ids[at] = top_ids[at - 1];
      --at;
    }
    top_ids[at] = static_cast<std::int32_t>(i);
  }
  for (std::uint32_t j = 0; j < top; ++j) {
    if (j < kept) {
      top_logprobs[j] = logprob(logits[static_cast<std::size_t>(top_ids[j])]);
    } else {
      top_ids[j] = -1;
      top_logprobs[j] = -INFINITY;
    }
  }
}

}  // namespace kvvm::model
