// Device sampling (include/kvvm/kernels/model_kernels.h, sample_cuda): the CPU's sample_token
// (src/model/sampling.cc) for one row per block, without sorting the vocabulary.
//
// How: every truncation and the final draw ask the same question, "which element of the
// kept set, in walk order, is the first whose running sum reaches a target?". Walk order is
// ascending by a 32-bit key (the logit's bits, descending by value, when a truncation sorts;
// the id otherwise), the lower id first among equal keys. A radix selection answers it one
// byte of the key at a time: a 256-bin histogram (count and mass) of the elements whose
// higher bytes match the prefix chosen so far, then the bin the target falls in. Equal keys
// have equal weights, so the rank among them follows from the mass left, and one more pass
// finds that rank's id in id order.
//
// Why the masses may differ from the CPU's in the last bits: bins are summed by warp
// reductions and shared-memory atomics, the CPU in walk order; a different token needs a target
// within rounding of a cumulative mass.
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kvvm/kernels/model_kernels.h"

namespace kvvm {
namespace kernels {
namespace {

constexpr unsigned kSampleThreads = 512;
constexpr unsigned kBins = 256;
constexpr std::uint32_t kNone = 0xffffffffu;

// splitmix64's finalizer and counter_uniform, bit for bit as src/model/sampling.cc.
__device__ __forceinline__ std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

__device__ __forceinline__ double counter_uniform(std::uint64_t seed, std::uint64_t counter) {
  const std::uint64_t h =
      mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ (counter * 0xd1b54a32d192ed03ull + 1));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

// Ascending in the float's value; -0 and +0 share a key (the CPU compares them equal).
__device__ __forceinline__ std::uint32_t ascending_key(float value) {
  if (value == 0.0f) value = 0.0f;
  const std::uint32_t bits = __float_as_uint(value);
  return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

// The value of a descending key (the inverse of ~ascending_key).
__device__ __forceinline__ float value_of(std::uint32_t descending) {
  const std::uint32_t ascending = ~descending;
  const std::uint32_t bits =
      (ascending & 0x80000000u) != 0 ? (ascending & 0x7fffffffu) : ~ascending;
  return __uint_as_float(bits);
}

// The row's state, shared by the block. A truncation keeps keys below its cut key, and at
// the cut key the ids up to its cut id.
struct RowState {
  double temperature;
  double max_weight;
  bool sorted;  // walk key: descending logit (a truncation applies), else the id
  bool min_p;
  double log_min_p;
  bool top_k;
  std::uint32_t k_key, k_id;
  bool top_p;
  std::uint32_t p_key, p_id;
};

struct Selection {
  std::uint32_t key;   // the chosen element's walk key
  std::uint32_t rank;  // its rank among the kept elements of that key, in id order
};

struct Shared {
  RowState state;
  double bin_mass[kBins];
  std::uint32_t bin_count[kBins];
  std::uint32_t thread_count[kSampleThreads];
  std::uint32_t prefix;
  double above;
  double target;
  std::uint32_t tie_count;
  std::uint32_t found_id;
  float best[kSampleThreads / 32];
  std::uint32_t best_index[kSampleThreads / 32];
  std::uint32_t valid[kSampleThreads / 32];
};

__device__ __forceinline__ std::uint32_t walk_key(const RowState& s, float value,
                                                  std::uint32_t id) {
  return s.sorted ? ~ascending_key(value) : id;
}

__device__ __forceinline__ bool within(std::uint32_t key, std::uint32_t id, std::uint32_t cut_key,
                                       std::uint32_t cut_id) {
  return key < cut_key || (key == cut_key && id <= cut_id);
}

__device__ __forceinline__ bool kept(const RowState& s, float value, std::uint32_t id) {
  if (isnan(value)) return false;
  // min_p first: p / p_max >= min_p in the log domain, in double as on the CPU.
  if (s.min_p && !(static_cast<double>(value) / s.temperature - s.max_weight >= s.log_min_p)) {
    return false;
  }
  if (!s.top_k && !s.top_p) return true;
  const std::uint32_t key = ~ascending_key(value);
  return (!s.top_k || within(key, id, s.k_key, s.k_id)) &&
         (!s.top_p || within(key, id, s.p_key, s.p_id));
}

__device__ __forceinline__ double weight_of(const RowState& s, float value) {
  return exp(static_cast<double>(value) / s.temperature - s.max_weight);
}

__device__ __forceinline__ bool reaches(double target, double cumulative, bool strict) {
  return strict ? target < cumulative : target <= cumulative;
}

// The first kept element, in walk order, whose running measure (1 when `count`, else its
// weight) reaches the target: `target` itself when `count`, else target * the kept set's
// total; `strict`: the running sum must exceed it. When rounding leaves the target past the
// total, the last element of positive measure. Called by every thread.
__device__ Selection select(const float* row, std::uint32_t vocab, Shared& sh, bool count,
                            double target, bool strict, int top_shift) {
  const RowState& s = sh.state;
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.above = 0;
  }
  for (int shift = top_shift; shift >= 0; shift -= 8) {
    for (unsigned b = threadIdx.x; b < kBins; b += blockDim.x) {
      sh.bin_mass[b] = 0;
      sh.bin_count[b] = 0;
    }
    __syncthreads();
    const std::uint32_t prefix = sh.prefix;
    const std::uint32_t high = shift >= 24 ? 0u : ~((1u << (shift + 8)) - 1u);
    // Every lane runs the same iterations, so the warp can add up its lanes of one bin
    // before one shared atomic per bin it touches (most logits share a few exponent bins).
    for (std::uint32_t base = 0; base < vocab; base += blockDim.x) {
      const std::uint32_t i = base + threadIdx.x;
      unsigned bin = kBins;  // none
      double mass = 0;
      if (i < vocab) {
        const float value = row[i];
        if (kept(s, value, i)) {
          const std::uint32_t key = walk_key(s, value, i);
          if ((key & high) == (prefix & high)) {
            bin = (key >> shift) & 0xffu;
            mass = count ? 1.0 : weight_of(s, value);
          }
        }
      }
      unsigned pending = __ballot_sync(0xffffffffu, bin != kBins);
      while (pending != 0) {
        const int leader = __ffs(static_cast<int>(pending)) - 1;
        const unsigned chosen = __shfl_sync(0xffffffffu, bin, leader);
        const bool mine = bin == chosen;
        const unsigned members = __ballot_sync(0xffffffffu, mine);
        if (!count) {
          double sum = mine ? mass : 0.0;
          for (int offset = 16; offset > 0; offset >>= 1) {
            sum += __shfl_xor_sync(0xffffffffu, sum, offset);
          }
          if (threadIdx.x % 32 == static_cast<unsigned>(leader)) {
            atomicAdd(&sh.bin_mass[chosen], sum);
          }
        }
        if (threadIdx.x % 32 == static_cast<unsigned>(leader)) {
          atomicAdd(&sh.bin_count[chosen], static_cast<unsigned>(__popc(members)));
        }
        pending &= ~members;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0 && count) {
      for (unsigned b = 0; b < kBins; ++b) sh.bin_mass[b] = sh.bin_count[b];
    }
    if (threadIdx.x == 0) {
      if (shift == top_shift) {
        // The first level sees the whole kept set: its total scales a fractional target.
        double total = 0;
        for (unsigned b = 0; b < kBins; ++b) total += sh.bin_mass[b];
        sh.target = count ? target : target * total;
      }
      double run = sh.above;
      int chosen = -1, last_positive = -1;
      double chosen_above = run, last_above = run;
      for (unsigned b = 0; b < kBins; ++b) {
        if (sh.bin_count[b] == 0) continue;
        const double next = run + sh.bin_mass[b];
        if (sh.bin_mass[b] > 0) {
          last_positive = static_cast<int>(b);
          last_above = run;
          if (reaches(sh.target, next, strict)) {
            chosen = static_cast<int>(b);
            chosen_above = run;
            break;
          }
        }
        run = next;
      }
      if (chosen < 0) {
        chosen = last_positive;
        chosen_above = last_above;
      }
      if (chosen < 0) {  // nothing of positive measure: cannot happen (the maximum weighs 1)
        for (unsigned b = 0; b < kBins; ++b) {
          if (sh.bin_count[b] != 0) {
            chosen = static_cast<int>(b);
            break;
          }
        }
        chosen = chosen < 0 ? 0 : chosen;
      }
      sh.prefix = prefix | (static_cast<std::uint32_t>(chosen) << shift);
      sh.above = chosen_above;
      sh.tie_count = sh.bin_count[chosen];
    }
    __syncthreads();
  }
  Selection selection{sh.prefix, 0};
  if (threadIdx.x == 0) {
    std::uint32_t rank = 0;
    const std::uint32_t ties = sh.tie_count;
    if (ties > 1) {
      // Equal keys weigh the same: the number m of them the target needs, in id order.
      const double w = count ? 1.0 : weight_of(s, value_of(sh.prefix));
      const double above = sh.above, goal = sh.target;
      double m = w > 0 ? floor((goal - above) / w) : 1.0;
      m = fmin(fmax(m, 1.0), static_cast<double>(ties));
      auto n = static_cast<std::uint32_t>(m);
      while (n > 1 && reaches(goal, above + (n - 1) * w, strict)) --n;
      while (n < ties && !reaches(goal, above + n * w, strict)) ++n;
      rank = n - 1;
    }
    sh.found_id = rank;  // handed to every thread below
  }
  __syncthreads();
  selection.rank = sh.found_id;
  __syncthreads();
  return selection;
}

// The id of the kept element of walk key `key` with rank `rank` among them in id order. Each
// thread takes a contiguous range of ids so that a scan of per-thread counts orders them.
__device__ std::uint32_t nth_tie(const float* row, std::uint32_t vocab, Shared& sh,
                                 std::uint32_t key, std::uint32_t rank) {
  const RowState& s = sh.state;
  if (!s.sorted) return key;  // ids are unique
  const std::uint32_t per = (vocab + blockDim.x - 1) / blockDim.x;
  const std::uint32_t begin = min(vocab, threadIdx.x * per);
  const std::uint32_t end = min(vocab, begin + per);
  std::uint32_t mine = 0;
  for (std::uint32_t i = begin; i < end; ++i) {
    const float value = row[i];
    if (kept(s, value, i) && walk_key(s, value, i) == key) ++mine;
  }
  sh.thread_count[threadIdx.x] = mine;
  if (threadIdx.x == 0) sh.found_id = kNone;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint32_t offset = 0;
    for (unsigned t = 0; t < blockDim.x; ++t) {
      const std::uint32_t c = sh.thread_count[t];
      sh.thread_count[t] = offset;
      offset += c;
    }
  }
  __syncthreads();
  const std::uint32_t first = sh.thread_count[threadIdx.x];
  if (rank >= first && rank < first + mine) {
    std::uint32_t seen = first;
    for (std::uint32_t i = begin; i < end; ++i) {
      const float value = row[i];
      if (!kept(s, value, i) || walk_key(s, value, i) != key) continue;
      if (seen == rank) {
        sh.found_id = i;
        break;
      }
      ++seen;
    }
  }
  __syncthreads();
  const std::uint32_t id = sh.found_id;
  __syncthreads();
  return id;
}

__global__ void __launch_bounds__(kSampleThreads) sample_kernel(const SampleParams p) {
  __shared__ Shared sh;
  const float* row = p.logits + static_cast<std::uint64_t>(blockIdx.x) * p.vocab;
  const SamplingRow params = p.rows_params[blockIdx.x];
  if (p.argmax != nullptr && (params.temperature == 0 || params.top_k == 1)) {
    if (threadIdx.x == 0) p.out[blockIdx.x] = p.argmax[blockIdx.x];
    return;
  }

  // The argmax (lowest id among equal maxima, NaN never) and the count of non-NaN logits.
  float best = kNegInf;
  std::uint32_t best_index = kNone, valid = 0;
  for (std::uint32_t i = threadIdx.x; i < p.vocab; i += blockDim.x) {
    const float value = row[i];
    if (isnan(value)) continue;
    ++valid;
    if (best_index == kNone || value > best) {
      best = value;
      best_index = i;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const std::uint32_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    valid += __shfl_xor_sync(0xffffffffu, valid, offset);
    if (other_index != kNone &&
        (best_index == kNone || other > best || (other == best && other_index < best_index))) {
      best = other;
      best_index = other_index;
    }
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sh.best[warp] = best;
    sh.best_index[warp] = best_index;
    sh.valid[warp] = valid;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    best = kNegInf;
    best_index = kNone;
    valid = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) {
      valid += sh.valid[w];
      const float other = sh.best[w];
      const std::uint32_t other_index = sh.best_index[w];
      if (other_index != kNone &&
          (best_index == kNone || other > best || (other == best && other_index < best_index))) {
        best = other;
        best_index = other_index;
      }
    }
    sh.best[0] = best;
    sh.best_index[0] = best_index;
    sh.valid[0] = valid;
  }
  __syncthreads();
  best = sh.best[0];
  best_index = sh.best_index[0];
  valid = sh.valid[0];
  const std::int32_t greedy = best_index == kNone ? 0 : static_cast<std::int32_t>(best_index);

  const double temperature = params.temperature;
  const double max_weight = static_cast<double>(best) / temperature;
  // Greedy, or no finite maximum (all -inf, or +inf present): the softmax's limit is the
  // argmax, as on the CPU. Uniform across the block, so every thread returns together.
  if (params.temperature == 0 || params.top_k == 1 || valid == 0 || !isfinite(max_weight)) {
    if (threadIdx.x == 0) p.out[blockIdx.x] = greedy;
    return;
  }
  const bool top_k = params.top_k > 0 && params.top_k < valid;
  const bool top_p = params.top_p < 1;
  if (threadIdx.x == 0) {
    sh.state.temperature = temperature;
    sh.state.max_weight = max_weight;
    sh.state.sorted = top_k || top_p;
    sh.state.top_k = false;
    sh.state.top_p = false;
    sh.state.min_p = params.min_p > 0;
    sh.state.log_min_p = params.min_p > 0 ? log(static_cast<double>(params.min_p)) : 0.0;
  }
  __syncthreads();
  if (top_k) {
    const Selection k = select(row, p.vocab, sh, true, params.top_k, false, 24);
    const std::uint32_t id = nth_tie(row, p.vocab, sh, k.key, k.rank);
    if (threadIdx.x == 0) {
      sh.state.top_k = true;
      sh.state.k_key = k.key;
      sh.state.k_id = id;
    }
    __syncthreads();
  }
  if (top_p) {
    const Selection cut = select(row, p.vocab, sh, false, params.top_p, false, 24);
    const std::uint32_t id = nth_tie(row, p.vocab, sh, cut.key, cut.rank);
    if (threadIdx.x == 0) {
      sh.state.top_p = true;
      sh.state.p_key = cut.key;
      sh.state.p_id = id;
    }
    __syncthreads();
  }
  const std::uint64_t seed = (std::uint64_t{params.seed_high} << 32) | params.seed_low;
  const std::uint64_t counter = (std::uint64_t{params.counter_high} << 32) | params.counter_low;
  const double u = counter_uniform(seed, counter);
  // Ids walk from the highest byte their range uses; sorted keys use all four.
  int top_shift = 24;
  if (!sh.state.sorted) {
    top_shift = p.vocab <= (1u << 8)    ? 0
                : p.vocab <= (1u << 16) ? 8
                : p.vocab <= (1u << 24) ? 16
                                        : 24;
  }
  const Selection drawn = select(row, p.vocab, sh, false, u, true, top_shift);
  const std::uint32_t id = nth_tie(row, p.vocab, sh, drawn.key, drawn.rank);
  if (threadIdx.x == 0) p.out[blockIdx.x] = id == kNone ? greedy : static_cast<std::int32_t>(id);
}

}  // namespace
}  // namespace kernels

Status sample_cuda(const SampleParams& p, void* stream) {
  if (p.rows == 0) return Status::Ok();
  if (p.vocab == 0) return Status::InvalidArgument("sample: vocab is 0");
  if (p.logits == nullptr || p.rows_params == nullptr || p.out == nullptr) {
    return Status::InvalidArgument(std::string("sample: ") +
                                   (p.logits == nullptr        ? "logits"
                                    : p.rows_params == nullptr ? "rows_params"
                                                               : "out") +
                                   " is null");
  }
  kernels::sample_kernel<<<p.rows, kernels::kSampleThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p);
  return kernels::cuda_status("sample_kernel<<<>>>", cudaGetLastError());
}

}  // namespace kvvm
