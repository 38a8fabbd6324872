// The CPU forward pass's elementwise pieces on float32 rows (the GEMMs are OpenBLAS's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvvm::model::cpu {

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight for `rows` rows of `width` (HF's
// RMSNorm: the variance in float32 or better, then the weight). `out` may be `x` (each row is
// read whole before it is written).
void rms_norm(const float* x, const float* weight, std::size_t rows, std::size_t width, float eps,
              float* out);

// y[r] += bias for `rows` rows of `width`.
void add_bias(float* y, const float* bias, std::size_t rows, std::size_t width);

// x[i] += y[i] for i < n (the residual connection).
void add_into(float* x, const float* y, std::size_t n);

// gate[i] = silu(gate[i]) * up[i] for i < n; silu(g) = g / (1 + exp(-g)).
void silu_mul(float* gate, const float* up, std::size_t n);

// out[t] = table[ids[t]] for each token (ids already checked against the table's rows).
void gather_rows(const float* table, std::size_t width, std::span<const std::int32_t> ids,
                 float* out);

// y[rows][n] = x[rows][k] * w[n][k]^T (a Hugging Face Linear without its bias), one sgemm.
void linear(const float* x, std::size_t rows, std::size_t k, const float* w, std::size_t n,
            float* y);

// y[rows][hidden] = down(silu(gate(x)) * up(x)), Hugging Face's SiLU MLP, for x [rows][hidden];
// gate, up [inter][hidden], down [hidden][inter]; gate_buf and up_buf hold rows * inter floats.
// y may be x (x is read whole before y is written).
void silu_mlp(const float* x, std::size_t rows, std::size_t hidden, const float* gate,
              const float* up, const float* down, std::size_t inter, float* gate_buf, float* up_buf,
              float* y);

// The index of the largest value; the lowest index among equals (NaN never wins).
std::int32_t argmax(const float* values, std::size_t n);

}  // namespace kvvm::model::cpu
