// Deterministic, position-dependent byte patterns for content checks (never zeros).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace kvvm::testing {

// Bytes that depend on `seed` and the position, drawn fresh per seed: a wrong offset,
// a stale window or an unwritten byte all show up as a mismatch.
inline std::vector<std::uint8_t> pattern(std::size_t bytes, std::uint64_t seed) {
  std::vector<std::uint8_t> data(bytes);
  std::mt19937_64 random(seed * 0x9E3779B97F4A7C15ull + 1);
  for (std::size_t i = 0; i < bytes; i += 8) {
    std::uint64_t word = random() | 1;  // never an all-zero word
    for (std::size_t j = 0; j < 8 && i + j < bytes; ++j) data[i + j] = (word >> (8 * j)) & 0xff;
  }
  return data;
}

// splitmix64: turns any number into well-spread bits (seeds, tags, fault plans).
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::uint64_t fresh_seed() {
  static std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) | device();
}

}  // namespace kvvm::testing
