// The CPU forward pass's elementwise pieces.
#include "model/cpu/cpu_ops.h"

#include <cblas.h>

#include <cmath>
#include <cstring>

namespace kvvm::model::cpu {

void rms_norm(const float* x, const float* weight, std::size_t rows, std::size_t width, float eps,
              float* out) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * width;
    double sum = 0;  // HF's float32 mean, accumulated here without its rounding
    for (std::size_t i = 0; i < width; ++i) sum += double{row[i]} * row[i];
    const auto variance = static_cast<float>(sum / static_cast<double>(width));
    const float inverse = 1.0f / std::sqrt(variance + eps);
    float* o = out + r * width;
    for (std::size_t i = 0; i < width; ++i) o[i] = weight[i] * (row[i] * inverse);
  }
}

void add_bias(float* y, const float* bias, std::size_t rows, std::size_t width) {
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = y + r * width;
    for (std::size_t i = 0; i < width; ++i) row[i] += bias[i];
  }
}

void add_into(float* x, const float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] += y[i];
}

void silu_mul(float* gate, const float* up, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void silu_mlp(const float* x, std::size_t rows, std::size_t hidden, const float* gate,
              const float* up, const float* down, std::size_t inter, float* gate_buf, float* up_buf,
              float* y) {
  linear(x, rows, hidden, gate, inter, gate_buf);
  linear(x, rows, hidden, up, inter, up_buf);
  silu_mul(gate_buf, up_buf, rows * inter);
  linear(gate_buf, rows, inter, down, hidden, y);
}

void gather_rows(const float* table, std::size_t width, std::span<const std::int32_t> ids,
                 float* out) {
  for (std::size_t t = 0; t < ids.size(); ++t) {
    std::memcpy(out + t * width, table + static_cast<std::size_t>(ids[t]) * width,
                width * sizeof(float));
  }
}

void linear(const float* x, std::size_t rows, std::size_t k, const float* w, std::size_t n,
            float* y) {
  if (rows == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, x, static_cast<blasint>(k), w,
              static_cast<blasint>(k), 0.0f, y, static_cast<blasint>(n));
}

std::int32_t argmax(const float* values, std::size_t n) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < n; ++i) {
    if (values[i] > values[best] || (std::isnan(values[best]) && !std::isnan(values[i]))) best = i;
  }
  return static_cast<std::int32_t>(best);
}

}  // namespace kvvm::model::cpu
