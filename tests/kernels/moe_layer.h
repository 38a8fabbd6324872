// A MoE layer on the device for the grouped GEMMs' tests and their float64 references: routing
// ids and weights chosen on the host, x, expert weights in a format, an optional shared expert;
// the permutation, gate|up and down + combine run on a stream; and the references for act (from
// x and the weights), for each pair's y (from the act the device wrote) and for out (from the y
// the device wrote), each with its tolerance stated from the rounding points.
#pragma once

#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "moe_fixture.h"

namespace kvvm::moe_kernels_test {

struct LayerShape {
  DType type = DType::kBf16;
  MoeWeightFormat format = MoeWeightFormat::kNone;
  std::uint32_t experts = 0, top_k = 0, hidden = 0, inter = 0;
  bool shared = false;
};

// The experts' weights and their device copies (one allocation per expert, as a residency
// cache would place them), shared by every batch run over them.
struct Experts {
  LayerShape shape;
  std::vector<ExpertWeights> gate_up, down;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  std::unique_ptr<DeviceBuffer> gate_up_table, down_table, gate_up_scales, down_scales;
  Experts(const LayerShape& s, std::mt19937& rng) : shape(s) {
    std::vector<const void*> gu, d;
    std::vector<const float*> gus, ds;
    for (std::uint32_t e = 0; e < s.experts; ++e) {
      gate_up.push_back(make_expert(s.type, s.format, 2 * s.inter, s.hidden, rng));
      down.push_back(make_expert(s.type, s.format, s.hidden, s.inter, rng));
      for (const ExpertWeights* w : {&gate_up.back(), &down.back()}) {
        buffers.push_back(std::make_unique<DeviceBuffer>(w->bytes));
        (w == &gate_up.back() ? gu : d).push_back(buffers.back()->get());
        if (s.format == MoeWeightFormat::kFp8Block128) {
          buffers.push_back(std::make_unique<DeviceBuffer>(w->scales));
          (w == &gate_up.back() ? gus : ds)
              .push_back(static_cast<const float*>(buffers.back()->get()));
        }
      }
    }
    gate_up_table = std::make_unique<DeviceBuffer>(gu);
    down_table = std::make_unique<DeviceBuffer>(d);
    if (s.format == MoeWeightFormat::kFp8Block128) {
      gate_up_scales = std::make_unique<DeviceBuffer>(gus);
      down_scales = std::make_unique<DeviceBuffer>(ds);
    }
  }
};

// One batch: its routing, activations and every buffer the three launches write.
struct Batch {
  const Experts& experts;
  std::uint32_t tokens;
  std::vector<std::int32_t> ids;
  std::vector<float> weights;                         // [tokens][top_k]
  std::vector<std::uint16_t> x, shared, shared_gate;  // element bits
  DevicePermutation permutation;
  DeviceBuffer d_x, d_weights, d_act, d_pairs, d_out, d_shared, d_shared_gate;

  Batch(const Experts& e, std::uint32_t tokens_, std::vector<std::int32_t> ids_, std::mt19937& rng)
      : experts(e),
        tokens(tokens_),
        ids(std::move(ids_)),
        permutation(tokens_, e.shape.top_k, e.shape.experts, kMoeRowTile),
        d_x(std::size_t{tokens_} * e.shape.hidden * 2),
        d_weights(std::size_t{tokens_} * e.shape.top_k * 4),
        d_act(std::max<std::uint64_t>(permutation.capacity, 1) * e.shape.inter * 2),
        d_pairs(std::size_t{tokens_} * e.shape.top_k * e.shape.hidden * 2),
        d_out(std::size_t{tokens_} * e.shape.hidden * 2),
        d_shared(std::size_t{tokens_} * e.shape.hidden * 2),
        d_shared_gate(std::size_t{tokens_} * 2) {
    const LayerShape& s = e.shape;
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_real_distribution<float> share(0.05f, 1.0f);
    x.resize(std::size_t{tokens} * s.hidden);
    for (std::uint16_t& v : x) v = to_bits(s.type, normal(rng));
    weights.resize(ids.size());
    for (float& w : weights) w = share(rng);
    shared.resize(std::size_t{tokens} * s.hidden);
    for (std::uint16_t& v : shared) v = to_bits(s.type, normal(rng));
    shared_gate.resize(tokens);
    for (std::uint16_t& v : shared_gate) v = to_bits(s.type, 2 * normal(rng));
    upload();
  }
  void upload() {
    permutation.ids.upload(ids);
    d_x.upload(x);
    d_weights.upload(weights);
    d_shared.upload(shared);
    d_shared_gate.upload(shared_gate);
  }
  void poison() {
    permutation.poison();
    d_act.poison();
    d_pairs.poison();
    d_out.poison();
  }
  MoeGateUpParams gate_up(std::uint32_t block_rows) const {
    const LayerShape& s = experts.shape;
    MoeGateUpParams p;
    p.element = s.type;
    p.format = s.format;
    p.tokens = tokens;
    p.top_k = s.top_k;
    p.experts = s.experts;
    p.hidden = s.hidden;
    p.inter = s.inter;
    p.x = d_x.get();
    p.gate_up = static_cast<const void* const*>(experts.gate_up_table->get());
    if (experts.gate_up_scales) {
      p.gate_up_scales = static_cast<const float* const*>(experts.gate_up_scales->get());
    }
    const MoePermuteParams perm = permutation.params();
    p.offsets = perm.offsets;
    p.rows = perm.rows;
    p.active = perm.active;
    p.act = d_act.get();
    p.block_rows = block_rows;
    return p;
  }
  MoeDownParams down(std::uint32_t block_rows) const {
    const LayerShape& s = experts.shape;
    MoeDownParams p;
    p.element = s.type;
    p.format = s.format;
    p.tokens = tokens;
    p.top_k = s.top_k;
    p.experts = s.experts;
    p.hidden = s.hidden;
    p.inter = s.inter;
    p.act = d_act.get();
    p.down = static_cast<const void* const*>(experts.down_table->get());
    if (experts.down_scales) {
      p.down_scales = static_cast<const float* const*>(experts.down_scales->get());
    }
    const MoePermuteParams perm = permutation.params();
    p.offsets = perm.offsets;
    p.rows = perm.rows;
    p.active = perm.active;
    p.slot_of_pair = perm.slot_of_pair;
    p.weights = static_cast<const float*>(d_weights.get());
    p.pairs = d_pairs.get();
    if (s.shared) {
      p.shared = d_shared.get();
      p.shared_gate = d_shared_gate.get();
    }
    p.out = d_out.get();
    p.block_rows = block_rows;
    return p;
  }
  // The three launches on `stream`.
  Status run(std::uint32_t block_rows, cudaStream_t stream) const {
    KVVM_RETURN_IF_ERROR(moe_permute_cuda(permutation.params(), stream));
    KVVM_RETURN_IF_ERROR(moe_expert_gate_up_cuda(gate_up(block_rows), stream));
    return moe_expert_down_cuda(down(block_rows), stream);
  }
  std::vector<std::uint16_t> act() const {
    return download<std::uint16_t>(d_act, permutation.capacity * experts.shape.inter);
  }
  std::vector<std::uint16_t> pairs() const {
    return download<std::uint16_t>(d_pairs, ids.size() * experts.shape.hidden);
  }
  std::vector<std::uint16_t> out() const {
    return download<std::uint16_t>(d_out, std::size_t{tokens} * experts.shape.hidden);
  }
};

// Float32 sums of `terms` products whose magnitudes add to `magnitude` err by at most about
// terms * 2^-24 * magnitude; twice that, as slack for the tensor cores' accumulation.
inline double sum_slack(std::uint32_t terms, double magnitude) {
  return 2.0 * terms * std::ldexp(magnitude, -24);
}

}  // namespace kvvm::moe_kernels_test

#endif  // KVVM_HAS_CUDA_KERNELS
